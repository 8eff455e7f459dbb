/* byte: the Evo 2 / BioNeMo byte tokenizer - token id = byte value of the (policy-resolved)
 * base; ids 0-4 are EOS, PAD, BOS, SEP, UNK (control bytes never seen in sequences).
 *
 * The one thing to know: with --vocab-size 512 (as Evo 2 configs use) ids 256-511 exist
 * only to size the embedding; no base maps to them. */
#include <stdio.h>
#include <string.h>

#include "tok_impl.h"

moe_status moe_tok_byte_build(moe_tokenizer *t, moe_err *err) {
    if (moe_tok_alloc_vocab(t, t->opts.vocab_size, err) != MOE_OK) return MOE_ERR_RUNTIME;
    t->eos_id = 0;
    t->pad_id = 1;
    t->bos_id = 2;
    t->sep_id = 3;
    t->unk_id = 4;
    t->n_id = 'N';
    static const char *const special[5] = {"<eos>", "<pad>", "<bos>", "<sep>", "<unk>"};
    char buf[32];
    for (int64_t i = 0; i < t->vocab_size; i++) {
        if (i < 5)
            snprintf(buf, sizeof buf, "%s", special[i]);
        else if (i < 256 && i > 32 && i < 127)
            snprintf(buf, sizeof buf, "%c", (int)i);
        else if (i < 256)
            snprintf(buf, sizeof buf, "<0x%02X>", (unsigned)i);
        else
            snprintf(buf, sizeof buf, "<extra_%lld>", (long long)i);
        if (moe_tok_set_vocab(t, i, buf, err) != MOE_OK) return MOE_ERR_RUNTIME;
    }
    moe_tok_fill_enc(t, NULL, 0);
    memset(t->dec, 0, sizeof t->dec);
    for (int c = 0; c < 256; c++) /* a token is its base */
        if (t->enc[c] >= 0) t->dec[t->enc[c]] = (char)t->enc[c];
    return MOE_OK;
}
