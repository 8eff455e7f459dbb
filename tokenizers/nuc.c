/* nuc: compact single-nucleotide tokenizer - PAD 0, BOS 1, EOS 2, MASK 3, UNK 4, then
 * A C G T N, then (IUPAC keep) R Y S W K M B D H V U, then (case keep) the lower-case twins
 * of all of those, then <extra_i> padding up to a multiple of 8.
 *
 * The one thing to know: the vocabulary depends on the case and IUPAC policies (16 tokens
 * for upper-case ACGTN, 48 for keep/keep), so the spec must travel with the shards. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "tok_impl.h"

moe_status moe_tok_nuc_build(moe_tokenizer *t, moe_err *err) {
    char bases[64];
    snprintf(bases, sizeof bases, "ACGTN%s", t->opts.iupac == MOE_IUPAC_KEEP ? "RYSWKMBDHVU" : "");
    size_t nb = strlen(bases);
    if (t->opts.case_policy == MOE_CASE_KEEP) {
        for (size_t i = 0; i < nb; i++)
            bases[nb + i] = (char)tolower((unsigned char)bases[i]);
        bases[2 * nb] = '\0';
        nb *= 2;
    }
    int64_t n = MOE_TOK_N_SPECIAL + (int64_t)nb;
    n = (n + 7) / 8 * 8;
    if (moe_tok_alloc_vocab(t, n, err) != MOE_OK) return MOE_ERR_RUNTIME;
    if (moe_tok_set_nt_specials(t, err) != MOE_OK) return MOE_ERR_RUNTIME;
    char buf[32];
    memset(t->dec, 0, sizeof t->dec);
    for (int64_t i = MOE_TOK_N_SPECIAL; i < n; i++) {
        if (i < MOE_TOK_N_SPECIAL + (int64_t)nb) {
            buf[0] = bases[i - MOE_TOK_N_SPECIAL];
            buf[1] = '\0';
            t->dec[i] = buf[0];
        } else
            snprintf(buf, sizeof buf, "<extra_%lld>", (long long)i);
        if (moe_tok_set_vocab(t, i, buf, err) != MOE_OK) return MOE_ERR_RUNTIME;
    }
    t->n_id = MOE_TOK_N_SPECIAL + 4; /* 'N' is the fifth base */
    moe_tok_fill_enc(t, bases, MOE_TOK_N_SPECIAL);
    return MOE_OK;
}
