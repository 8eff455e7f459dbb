/* kmer: non-overlapping k-mer tokenizer in the style of the Nucleotide Transformer -
 * PAD 0, BOS 1, EOS 2, MASK 3, UNK 4, then the 4^k k-mers over ACGT in lexicographic order
 * (first base most significant), then the single bases A C G T N, padded to a multiple of 8.
 *
 * The one thing to know: a sequence is cut at every N; each ACGT stretch becomes
 * floor(len/k) k-mers followed by len%k single-base tokens, and each N is its own token.
 * A k-mer is flagged lower-case (upper+mask) when any of its bases was lower case. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "tok_impl.h"

static const char ACGT[4] = {'A', 'C', 'G', 'T'};

moe_status moe_tok_kmer_build(moe_tokenizer *t, moe_err *err) {
    int k = t->opts.k;
    int64_t nk = (int64_t)1 << (2 * k);
    int64_t n = (MOE_TOK_N_SPECIAL + nk + 5 + 7) / 8 * 8;
    if (moe_tok_alloc_vocab(t, n, err) != MOE_OK) return MOE_ERR_RUNTIME;
    if (moe_tok_set_nt_specials(t, err) != MOE_OK) return MOE_ERR_RUNTIME;
    t->n_id = (int32_t)(MOE_TOK_N_SPECIAL + nk + 4);
    char buf[32];
    for (int64_t i = MOE_TOK_N_SPECIAL; i < n; i++) {
        int64_t j = i - MOE_TOK_N_SPECIAL;
        if (j < nk) {
            for (int b = 0; b < k; b++)
                buf[b] = ACGT[(j >> (2 * (k - 1 - b))) & 3];
            buf[k] = '\0';
        } else if (j < nk + 5) {
            buf[0] = "ACGTN"[j - nk];
            buf[1] = '\0';
        } else
            snprintf(buf, sizeof buf, "<extra_%lld>", (long long)i);
        if (moe_tok_set_vocab(t, i, buf, err) != MOE_OK) return MOE_ERR_RUNTIME;
    }
    memset(t->dec, 0, sizeof t->dec);
    moe_tok_fill_enc(t, "ACGTN", 0); /* base codes: the k-mers are built from them */
    return MOE_OK;
}

/* Pending ACGT bases not yet part of a k-mer. */
typedef struct pend {
    int n;
    int codes[8];
    int64_t pos[8];
    uint8_t lower[8];
} pend;

static void emit(moe_token_buf *out, int32_t id, uint8_t lower, int64_t pos) {
    out->ids[out->n] = id;
    out->lower[out->n] = lower;
    if (out->want_pos) out->pos[out->n] = pos;
    out->n++;
}

static void flush_singles(const moe_tokenizer *t, moe_token_buf *out, pend *p) {
    int64_t single0 = MOE_TOK_N_SPECIAL + ((int64_t)1 << (2 * t->opts.k));
    for (int i = 0; i < p->n; i++)
        emit(out, (int32_t)(single0 + p->codes[i]), p->lower[i], p->pos[i]);
    p->n = 0;
}

moe_status moe_tok_kmer_encode(const moe_tokenizer *t, const char *seq, int64_t len,
                               moe_token_buf *out, moe_err *err) {
    if (moe_token_buf_reserve(out, out->n + len, err) != MOE_OK) return MOE_ERR_RUNTIME;
    const int k = t->opts.k;
    const int collapse = t->opts.nrun == MOE_NRUN_COLLAPSE;
    pend p = {0};
    int prev_n = 0;
    for (int64_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)seq[i];
        int code = t->enc[c];
        if (code < 0) {
            if (code == MOE_TOK_DROP) continue;
            flush_singles(t, out, &p);
            moe_err_set(err, MOE_ERR_INPUT, NULL,
                        c > 32 && c < 127 ? "character '%c' (0x%02x) at base %lld is not a "
                                            "nucleotide code"
                                          : "byte %c0x%02x at base %lld is not a nucleotide code",
                        c > 32 && c < 127 ? c : ' ', c, (long long)i + 1);
            moe_err_hint(err, "IUPAC codes follow --iupac to-n|drop; gaps, '*', digits and "
                              "other characters must be removed from the input");
            return MOE_ERR_INPUT;
        }
        if (code == 4) { /* N */
            flush_singles(t, out, &p);
            if (!(collapse && prev_n)) emit(out, t->n_id, t->enc_lower[c], i);
            prev_n = 1;
            continue;
        }
        prev_n = 0;
        p.codes[p.n] = code;
        p.pos[p.n] = i;
        p.lower[p.n] = t->enc_lower[c];
        if (++p.n == k) {
            int32_t id = 0;
            uint8_t lo = 0;
            for (int b = 0; b < k; b++) {
                id = (id << 2) | p.codes[b];
                lo |= p.lower[b];
            }
            emit(out, MOE_TOK_N_SPECIAL + id, lo, p.pos[0]);
            p.n = 0;
        }
    }
    flush_singles(t, out, &p);
    return MOE_OK;
}

int64_t moe_tok_kmer_decode(const moe_tokenizer *t, const int32_t *ids, const uint8_t *lower,
                            int64_t n, char *out) {
    const int k = t->opts.k;
    const int64_t nk = (int64_t)1 << (2 * k);
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t j = (int64_t)ids[i] - MOE_TOK_N_SPECIAL;
        int lo = lower && lower[i];
        if (j >= 0 && j < nk) {
            for (int b = 0; b < k; b++) {
                char c = ACGT[(j >> (2 * (k - 1 - b))) & 3];
                out[m++] = lo ? (char)tolower((unsigned char)c) : c;
            }
        } else if (j >= nk && j < nk + 5) {
            char c = "ACGTN"[j - nk];
            out[m++] = lo ? (char)tolower((unsigned char)c) : c;
        }
    }
    return m;
}
