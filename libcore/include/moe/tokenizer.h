/* tokenizer: DNA/RNA sequences <-> token ids, described by a small JSON spec.
 *
 * Three tokenizers (implemented in tokenizers/): `byte` (id = byte value, Evo 2 / BioNeMo
 * layout: EOS 0, PAD 1, BOS 2, SEP 3, UNK 4; vocabulary 256 or 512), `nuc` (one token per
 * nucleotide, A C G T N [+ IUPAC codes] [+ lower-case twins], vocabulary padded to a
 * multiple of 8) and `kmer` (non-overlapping k-mers, Nucleotide Transformer style: split
 * at N, leftover bases become single-base tokens). The one thing to know: a tokenizer is
 * fully described by its spec JSON (moe_tokenizer_spec_json); the spec is stored in every
 * shard and checkpoint, and moe_tokenizer_from_json() rebuilds an identical tokenizer
 * (same vocabulary hash) so that training and embedding always tokenize the same way.
 *
 * The spec also records the document policies of moe-tokenize (reverse complement,
 * windows, minimum length, N-run splitting); those are applied by moe/tokenize.h, not by
 * moe_tokenizer_encode(), which handles one sequence: case, IUPAC and N-collapse policies. */
#ifndef MOE_TOKENIZER_H
#define MOE_TOKENIZER_H

#include <stdint.h>

#include "moe/err.h"

typedef enum moe_tokenizer_kind {
    MOE_TOKENIZER_BYTE = 1,
    MOE_TOKENIZER_NUC = 2,
    MOE_TOKENIZER_KMER = 3,
} moe_tokenizer_kind;

typedef enum moe_case_policy {
    MOE_CASE_KEEP = 0,       /* lower-case bases get their own tokens (byte, nuc) */
    MOE_CASE_UPPER = 1,      /* upper-case everything, the soft-mask is lost */
    MOE_CASE_UPPER_MASK = 2, /* upper-case tokens plus a per-token lower-case flag */
} moe_case_policy;

typedef enum moe_iupac_policy {
    MOE_IUPAC_KEEP = 0, /* R Y S W K M B D H V U are tokens (byte, nuc) */
    MOE_IUPAC_TO_N = 1, /* ambiguity codes become N; U becomes T */
    MOE_IUPAC_DROP = 2, /* ambiguity codes are removed; U becomes T */
} moe_iupac_policy;

typedef enum moe_nrun_policy {
    MOE_NRUN_KEEP = 0,     /* every N is a token */
    MOE_NRUN_COLLAPSE = 1, /* a run of N becomes one N token */
    MOE_NRUN_SPLIT = 2,    /* records are cut into documents at N runs (moe/tokenize.h) */
} moe_nrun_policy;

typedef enum moe_revcomp_policy {
    MOE_REVCOMP_NONE = 0,
    MOE_REVCOMP_ADD = 1,    /* every record also yields its reverse complement */
    MOE_REVCOMP_RANDOM = 2, /* each record is reverse-complemented with probability 1/2,
                               decided by a hash of (seed, record name, record ordinal) */
} moe_revcomp_policy;

typedef struct moe_tokenizer_opts {
    moe_tokenizer_kind kind;
    int64_t vocab_size; /* byte: 256 (default) or 512; others: 0 = computed */
    int k;              /* kmer: 1..8 (default 6) */
    moe_case_policy case_policy;
    moe_iupac_policy iupac;
    moe_nrun_policy nrun;
    moe_revcomp_policy revcomp;
    uint64_t seed;          /* for MOE_REVCOMP_RANDOM */
    int64_t window, stride; /* document windows in tokens (without BOS/EOS); 0 = whole */
    int64_t min_length;     /* documents with fewer tokens (without BOS/EOS) are dropped */
    int add_bos, add_eos;   /* wrap every document */
} moe_tokenizer_opts;

/* Defaults for a kind: byte -> vocab 256, case keep, IUPAC keep; nuc -> case keep, IUPAC
 * keep; kmer -> k 6, case upper, IUPAC to-n. All: N keep, no revcomp, no window,
 * min_length 1, no BOS, EOS on. */
void moe_tokenizer_opts_defaults(moe_tokenizer_opts *o, moe_tokenizer_kind kind);

typedef struct moe_tokenizer {
    const char *name; /* "byte", "nuc" or "kmer" */
    moe_tokenizer_kind kind;
    int64_t vocab_size; /* embedding rows; ids are in [0, vocab_size) */
    int32_t pad_id, eos_id, bos_id, unk_id, mask_id, sep_id; /* -1 when absent */
    int32_t n_id;                                            /* the token of an upper-case N base */
    uint64_t vocab_hash; /* FNV-1a 64 of the vocabulary strings, see docs/formats.md */
    moe_tokenizer_opts opts;
    /* private: built by the kind's implementation (tokenizers/) */
    const struct moe_tok_kind *impl; /* the kind's row of the table in tokenizer.c */
    char *spec_json;                 /* canonical spec, NUL-terminated */
    char **vocab;                    /* [vocab_size] printable token strings */
    int16_t enc[256];       /* byte -> id (byte/nuc) or base code (kmer); <0: see tok_impl */
    uint8_t enc_lower[256]; /* byte -> lower-case flag under upper+mask */
    uint8_t enc_is_n[256];  /* byte -> the base counts as N (collapse/split) */
    char dec[1024];         /* id -> base for single-base tokens, 0 for none */
} moe_tokenizer;

/* Token ids plus (optional) per-token lower-case flags and source positions. Encode
 * appends to it; reset by setting n = 0. */
typedef struct moe_token_buf {
    int32_t *ids;   /* [cap] */
    uint8_t *lower; /* [cap] 1 = token came from lower-case bases (upper+mask policy) */
    int64_t *pos;   /* [cap] offset of the token's first base in the input; filled only
                       when want_pos is set */
    int64_t n, cap;
    int want_pos;
} moe_token_buf;

/* Builds a tokenizer; MOE_ERR_INPUT for an invalid option combination (the message says
 * which option and why, e.g. kmer with --case keep). */
moe_status moe_tokenizer_create(moe_tokenizer **out, const moe_tokenizer_opts *o, moe_err *err);
/* Rebuilds a tokenizer from its spec JSON (as stored in shards and checkpoints); `src`
 * names where the JSON came from for error messages (may be NULL). Checks that the vocabulary
 * hash recorded in the spec matches the rebuilt vocabulary. */
moe_status moe_tokenizer_from_json(moe_tokenizer **out, const char *json, const char *src,
                                   moe_err *err);
void moe_tokenizer_free(moe_tokenizer *t);
/* Canonical spec JSON (compact, keys sorted), owned by t. */
const char *moe_tokenizer_spec_json(const moe_tokenizer *t);
/* Printable string of a token ("A", "a", "ACGTAC", "<eos>", "0x41"); "?" when out of range. */
const char *moe_tokenizer_token_str(const moe_tokenizer *t, int32_t id);
int moe_tokenizer_is_special(const moe_tokenizer *t, int32_t id);
/* Most bases one token decodes to (k for kmer, 1 otherwise). */
int moe_tokenizer_max_bases_per_token(const moe_tokenizer *t);

/* Appends the tokens of seq[0, len) to out, no BOS/EOS. Applies the case, IUPAC and
 * N-collapse policies (N-split is a document policy and acts like keep here). A character
 * outside the alphabet is an MOE_ERR_INPUT naming it and its 1-based position; the caller
 * adds file and record with moe_err_prefix/moe_err_at_record. */
moe_status moe_tokenizer_encode(const moe_tokenizer *t, const char *seq, int64_t len,
                                moe_token_buf *out, moe_err *err);
/* BOS (if opts.add_bos) + encode + EOS (if opts.add_eos); pos of BOS/EOS = -1. */
moe_status moe_tokenizer_encode_doc(const moe_tokenizer *t, const char *seq, int64_t len,
                                    moe_token_buf *out, moe_err *err);
/* Writes the bases of ids[0, n) to out (room for n * max_bases_per_token bytes), skipping
 * special tokens; lower (may be NULL) lower-cases flagged tokens, so upper+mask shards
 * decode to the original case. Returns the number of bases written. */
int64_t moe_tokenizer_decode(const moe_tokenizer *t, const int32_t *ids, /* [n] */
                             const uint8_t *lower, /* [n] or NULL */ int64_t n, char *out);
/* 1 when id is an N token (either case): used to split records at N runs. */
int moe_tokenizer_is_n(const moe_tokenizer *t, int32_t id);

moe_status moe_token_buf_reserve(moe_token_buf *b, int64_t cap, moe_err *err);
void moe_token_buf_free(moe_token_buf *b);

/* Policy names as written on the command line and in the spec ("keep", "upper+mask", ...);
 * parse functions return -1 for an unknown name. */
const char *moe_case_policy_name(moe_case_policy p);
const char *moe_iupac_policy_name(moe_iupac_policy p);
const char *moe_nrun_policy_name(moe_nrun_policy p);
const char *moe_revcomp_policy_name(moe_revcomp_policy p);
int moe_case_policy_parse(const char *s);
int moe_iupac_policy_parse(const char *s);
int moe_nrun_policy_parse(const char *s);
int moe_revcomp_policy_parse(const char *s);
int moe_tokenizer_kind_parse(const char *s); /* "byte", "nuc", "kmer" */

#endif
