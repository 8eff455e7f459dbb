/* tok_impl: what libcore/src/tokenize/tokenizer.c needs from each tokenizer kind
 * (tokenizers/byte.c, nuc.c, kmer.c).
 *
 * A kind is one row of the table in tokenizer.c (moe_tok_kind): its build function fills
 * the vocabulary strings, the special ids and the byte tables of a moe_tokenizer whose opts
 * are already validated; encode/decode are generic for one-token-per-base kinds (byte, nuc)
 * and specialised for kmer. The one thing to
 * know: enc[] values below zero mean "not in the alphabet" (MOE_TOK_BAD) or "removed by
 * the IUPAC drop policy" (MOE_TOK_DROP). */
#ifndef MOE_TOK_IMPL_H
#define MOE_TOK_IMPL_H

#include "moe/tokenizer.h"

#define MOE_TOK_BAD (-1)
#define MOE_TOK_DROP (-2)

/* Number of specials at the start of the nuc and kmer vocabularies: pad bos eos mask unk. */
#define MOE_TOK_N_SPECIAL 5

/* Resolves one input byte through the IUPAC and case policies: the base it becomes (0 for
 * not-in-alphabet, 1 for dropped) and whether it was lower case. */
char moe_tok_resolve_base(const moe_tokenizer_opts *o, unsigned char c, int *lower);

/* Allocates t->vocab with n entries (all NULL) and sets t->vocab_size. */
moe_status moe_tok_alloc_vocab(moe_tokenizer *t, int64_t n, moe_err *err);
/* strdup into t->vocab[i]. */
moe_status moe_tok_set_vocab(moe_tokenizer *t, int64_t i, const char *s, moe_err *err);
/* The specials that start the nuc and kmer vocabularies (t->vocab allocated): ids and
 * strings of PAD 0, BOS 1, EOS 2, MASK 3, UNK 4. */
moe_status moe_tok_set_nt_specials(moe_tokenizer *t, moe_err *err);
/* Fills enc, enc_lower and enc_is_n for every byte through the IUPAC and case policies: a
 * base becomes first_id + its index in alphabet (NULL: its byte value), a dropped one
 * MOE_TOK_DROP, anything else MOE_TOK_BAD. */
void moe_tok_fill_enc(moe_tokenizer *t, const char *alphabet, int first_id);

/* One tokenizer kind, as the table in tokenizer.c lists it: build fills the vocabulary,
 * the special ids and the byte tables of t (opts validated, name set); encode and decode are
 * moe_tokenizer_encode and moe_tokenizer_decode for this kind. */
typedef struct moe_tok_kind {
    moe_tokenizer_kind kind;
    const char *name; /* in the spec ("name") and on the command line (--tokenizer) */
    moe_status (*build)(moe_tokenizer *t, moe_err *err);
    moe_status (*encode)(const moe_tokenizer *t, const char *seq, int64_t len, moe_token_buf *out,
                         moe_err *err);
    int64_t (*decode)(const moe_tokenizer *t, const int32_t *ids, /* [n] */
                      const uint8_t *lower, /* [n] or NULL */ int64_t n, char *out);
} moe_tok_kind;

moe_status moe_tok_byte_build(moe_tokenizer *t, moe_err *err);
moe_status moe_tok_nuc_build(moe_tokenizer *t, moe_err *err);
moe_status moe_tok_kmer_build(moe_tokenizer *t, moe_err *err);

moe_status moe_tok_kmer_encode(const moe_tokenizer *t, const char *seq, int64_t len,
                               moe_token_buf *out, moe_err *err);
int64_t moe_tok_kmer_decode(const moe_tokenizer *t, const int32_t *ids, const uint8_t *lower,
                            int64_t n, char *out);

#endif
