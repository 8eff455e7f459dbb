/* score: log-likelihoods of sequences and variant-effect scores with a trained checkpoint
 * (what moe-score runs).
 *
 * `seq`: every content token of a sequence gets log P(token | the tokens before it) in nats
 * (with BOS first when the tokenizer adds one; without BOS the first token has no context
 * and is not scored). A sequence longer than the model's context is scored in windows: the
 * first covers the first W tokens (W = context - BOS), each next one starts `context`
 * tokens before the end of the last and scores only the tokens after it, so every position
 * is scored exactly once with at least `context` tokens of left context (fewer only inside
 * the first window). EOS is never scored: it is not part of the sequence.
 *
 * `variants`: for each ALT allele of a VCF/BCF record, the REF window of W bases (the
 * variant's first base at offset W/2) and the ALT window (same left flank, the ALT allele,
 * then the reference after the REF allele, filled or trimmed on the right to W bases) are
 * scored; MOE_LLR = log P(ALT window) - log P(REF window). The one thing to know: the model
 * is causal, so the log-probabilities of the tokens both windows share at their start are
 * identical and cancel; they are left out of the difference (exact), and the REF window is
 * run once per record for all its ALTs (once for adjacent records at the same position).
 * Windows are batched longest first; the batching depends only on the input and the
 * options, so the output bytes are the same on every run. */
#ifndef MOE_SCORE_H
#define MOE_SCORE_H

#include <stdint.h>

#include "moe/config.h"
#include "moe/err.h"
#include "moe/seqio.h"

typedef struct moe_score_model_opts { /* what both subcommands share */
    const char *ckpt_dir;             /* a checkpoint directory, or a run directory (its latest) */
    moe_device_kind device;           /* auto: a usable GPU, else the CPU (as moe-embed) */
    int bf16;             /* 1 bf16 recipe, 0 fp32, -1 (default) bf16 on a GPU, fp32 on CPU */
    int rc_average;       /* average with the reverse complement (one base per token) */
    int64_t batch_tokens; /* padded tokens per forward pass (0: 8192) */
    int quiet;            /* no progress lines */
    int threads;          /* -@: CPU threads (moe_backend_open); 0: OpenMP's default */
    const char *command;  /* the command line, for the provenance lines (NULL: no CL field) */
} moe_score_model_opts;

typedef struct moe_score_seq_opts {
    moe_score_model_opts m;
    const char *const *inputs; /* sequence files ("-" = stdin) or .mtok shards */
    int n_inputs;
    moe_seqio_opts io;  /* filters, regions, reference for SAM/BAM/CRAM */
    const char *output; /* FILE.tsv, or FILE.npy with per_position; NULL or "-": stdout */
    int per_position;   /* FILE.npy [tokens] float32 + FILE.ids.tsv */
    int64_t context;    /* left context of every window after the first (0: W / 2) */
} moe_score_seq_opts;

typedef enum moe_score_reduce {
    MOE_SCORE_SUM = 0,  /* MOE_LLR = sum of log-probabilities (nats) */
    MOE_SCORE_MEAN = 1, /* mean per scored token */
} moe_score_reduce;

typedef struct moe_score_vcf_opts {
    moe_score_model_opts m;
    const char *fasta;          /* reference FASTA with a .fai (bgzip: also .gzi) */
    const char *vcf;            /* VCF/BCF, plain or bgzip; "-" = stdin */
    const char *const *regions; /* chr, chr:beg-end (1-based); records overlapping one */
    int n_regions;
    const char *output; /* NULL or "-": stdout */
    char format;        /* 'v' VCF, 'z' bgzip VCF, 'b' BCF */
    int tsv;            /* chrom pos id ref alt llr instead of a VCF */
    int64_t window;     /* W bases (0: 8192 or the model's context if smaller) */
    int window_grid;    /* 1: REF windows on a grid of W/2, shared by the variants in their
                           middle half; 0: centred on each variant */
    moe_score_reduce reduce;
    int check_ref_warn; /* REF mismatch: 0 error, 1 warn, skip and count */
} moe_score_vcf_opts;

void moe_score_seq_opts_defaults(moe_score_seq_opts *o);
void moe_score_vcf_opts_defaults(moe_score_vcf_opts *o);

typedef struct moe_score_summary {
    int64_t sequences, skipped;    /* seq: scored / without a scorable token */
    int64_t records, alts, scored; /* variants: records read, ALT alleles, ALTs scored */
    int64_t skip_symbolic, skip_edge, skip_ref; /* ALTs skipped: symbolic, window off the
                                                   contig, REF mismatch (--check-ref warn) */
    int64_t windows, tokens;                    /* windows run, tokens scored */
    double load_seconds, seconds;
} moe_score_summary;

/* Runs `moe-score seq`. Input problems are MOE_ERR_INPUT; nothing is left under a final
 * output name on failure. */
moe_status moe_score_seq_run(const moe_score_seq_opts *o, moe_score_summary *sum, moe_err *err);
/* Runs `moe-score variants`. Bad records are MOE_ERR_INPUT naming the record (or counted
 * skips, see moe_score_summary); the output appears only when complete. */
moe_status moe_score_vcf_run(const moe_score_vcf_opts *o, moe_score_summary *sum, moe_err *err);

#endif
