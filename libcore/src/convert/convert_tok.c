/* convert_tok: Hugging Face tokenizer files for the byte, nuc and kmer tokenizers, so that
 * AutoTokenizer.from_pretrained(OUT) tokenizes DNA the way moe-tokenize does.
 *
 * The tokenizers-library JSON written here is: a WordLevel model over the moe vocabulary
 * (every id, its printable string), a Split pre-tokenizer (byte, nuc: every character
 * alone, one base = one token; kmer: the regex "[ACGT]{k}|." matched leftmost-first, which
 * is exactly moe's rule - each ACGT stretch gives floor(len/k) k-mers, then single-base
 * leftovers, and N stands alone), a normalizer of Replace rules derived by encoding every
 * printable ASCII character with the moe tokenizer itself (so case and IUPAC policies
 * agree by construction: 'a' -> 'A' under case=upper, 'R' -> 'N' under iupac=to-n, ''
 * for dropped codes) plus "N+" -> "N" for n-runs=collapse, a TemplateProcessing
 * post-processor adding BOS/EOS as the spec says, and a Fuse decoder. The one thing to
 * know: characters moe-tokenize rejects become <unk> in Hugging Face instead of an error
 * (documented in docs/interop.md). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "moe/convert.h"
#include "moe/fileio.h"
#include "moe/tokenizer.h"

static json_t *added_token(int32_t id, const char *content) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_integer(id));
    json_object_set_new(o, "content", json_string(content));
    json_object_set_new(o, "single_word", json_false());
    json_object_set_new(o, "lstrip", json_false());
    json_object_set_new(o, "rstrip", json_false());
    json_object_set_new(o, "normalized", json_false());
    json_object_set_new(o, "special", json_true());
    return o;
}

static json_t *replace_rule(const char *kind, const char *pattern, const char *content) {
    json_t *o = json_object(), *p = json_object();
    json_object_set_new(o, "type", json_string("Replace"));
    json_object_set_new(p, kind, json_string(pattern));
    json_object_set_new(o, "pattern", p);
    json_object_set_new(o, "content", json_string(content));
    return o;
}

static json_t *template_piece(const char *kind, const char *id) {
    json_t *o = json_object(), *in = json_object();
    json_object_set_new(in, "id", json_string(id));
    json_object_set_new(in, "type_id", json_integer(0));
    json_object_set_new(o, kind, in);
    return o;
}

/* TemplateProcessing: [BOS] $A [EOS] (each only when the spec adds it). */
static json_t *post_processor(const moe_tokenizer *t) {
    const char *bos =
        t->opts.add_bos && t->bos_id >= 0 ? moe_tokenizer_token_str(t, t->bos_id) : NULL;
    const char *eos =
        t->opts.add_eos && t->eos_id >= 0 ? moe_tokenizer_token_str(t, t->eos_id) : NULL;
    json_t *o = json_object(), *single = json_array(), *pair = json_array(), *sp = json_object();
    json_object_set_new(o, "type", json_string("TemplateProcessing"));
    for (int k = 0; k < 2; k++) {
        json_t *arr = k ? pair : single;
        if (bos) json_array_append_new(arr, template_piece("SpecialToken", bos));
        json_array_append_new(arr, template_piece("Sequence", "A"));
        if (k) json_array_append_new(arr, template_piece("Sequence", "B"));
        if (eos) json_array_append_new(arr, template_piece("SpecialToken", eos));
    }
    const char *names[2] = {bos, eos};
    int32_t ids[2] = {t->bos_id, t->eos_id};
    for (int k = 0; k < 2; k++) {
        if (!names[k]) continue;
        json_t *e = json_object(), *il = json_array(), *tl = json_array();
        json_object_set_new(e, "id", json_string(names[k]));
        json_array_append_new(il, json_integer(ids[k]));
        json_array_append_new(tl, json_string(names[k]));
        json_object_set_new(e, "ids", il);
        json_object_set_new(e, "tokens", tl);
        json_object_set_new(sp, names[k], e);
    }
    json_object_set_new(o, "single", single);
    json_object_set_new(o, "pair", pair);
    json_object_set_new(o, "special_tokens", sp);
    return o;
}

/* Replace rules: what the moe tokenizer does to each printable character. */
static moe_status normalizer(const moe_tokenizer *t, json_t **out, moe_err *err) {
    json_t *rules = json_array();
    moe_token_buf b;
    memset(&b, 0, sizeof b);
    moe_status st = MOE_OK;
    for (int c = 0x21; st == MOE_OK && c < 0x7f; c++) {
        char s[2] = {(char)c, 0};
        moe_err sub;
        moe_err_clear(&sub);
        b.n = 0;
        if (moe_tokenizer_encode(t, s, 1, &b, &sub) != MOE_OK) continue; /* -> <unk> */
        if (b.n == 0) {
            json_array_append_new(rules, replace_rule("String", s, ""));
            continue;
        }
        const char *canon = moe_tokenizer_token_str(t, b.ids[0]);
        if (b.n != 1 || strlen(canon) != 1) {
            st = moe_err_set(err, MOE_ERR_RUNTIME, NULL,
                             "tokenizer %s maps '%c' to an unexpected token '%s'", t->name, c,
                             canon);
            break;
        }
        if (canon[0] != c) json_array_append_new(rules, replace_rule("String", s, canon));
    }
    moe_token_buf_free(&b);
    if (st == MOE_OK && t->opts.nrun == MOE_NRUN_COLLAPSE) {
        json_array_append_new(rules, replace_rule("Regex", "N+", "N"));
        if (t->opts.case_policy == MOE_CASE_KEEP)
            json_array_append_new(rules, replace_rule("Regex", "n+", "n"));
    }
    if (st != MOE_OK || json_array_size(rules) == 0) {
        json_decref(rules);
        *out = json_null();
        return st;
    }
    json_t *seq = json_object();
    json_object_set_new(seq, "type", json_string("Sequence"));
    json_object_set_new(seq, "normalizers", rules);
    *out = seq;
    return MOE_OK;
}

static void set_special(json_t *o, const moe_tokenizer *t, const char *key, int32_t id) {
    if (id >= 0) json_object_set_new(o, key, json_string(moe_tokenizer_token_str(t, id)));
}

static moe_status dump(json_t *o, const char *dir, const char *name, moe_err *err) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (!text) return moe_err_set(err, MOE_ERR_RUNTIME, path, "cannot encode JSON");
    moe_status st = moe_write_text_file(path, text, "\n", err);
    free(text);
    return st;
}

moe_status moe_convert_write_hf_tokenizer(const char *spec_json, int64_t model_max_length,
                                          const char *dir, int *written, moe_err *err) {
    *written = 0;
    moe_tokenizer *t = NULL;
    moe_status st = moe_tokenizer_from_json(&t, spec_json, "tokenizer.json", err);
    if (st != MOE_OK) return st;
    json_t *tj = json_object(), *added = json_array(), *vocab = json_object();
    json_object_set_new(tj, "version", json_string("1.0"));
    json_object_set_new(tj, "truncation", json_null());
    json_object_set_new(tj, "padding", json_null());
    for (int32_t id = 0; id < (int32_t)t->vocab_size; id++) {
        const char *s = moe_tokenizer_token_str(t, id);
        /* k = 1: the 1-mers and the single-base leftovers share strings; the 1-mers come
         * first and are the ones moe produces */
        if (!json_object_get(vocab, s)) json_object_set_new(vocab, s, json_integer(id));
        if (moe_tokenizer_is_special(t, id) || (s[0] == '<' && s[1]))
            json_array_append_new(added, added_token(id, s));
    }
    json_object_set_new(tj, "added_tokens", added);
    json_t *norm;
    st = normalizer(t, &norm, err);
    json_object_set_new(tj, "normalizer", norm);
    json_t *pre = json_object(), *pat = json_object();
    json_object_set_new(pre, "type", json_string("Split"));
    char regex[32] = ".";
    if (t->kind == MOE_TOKENIZER_KMER) /* leftmost-first: k-mers, then single leftovers */
        snprintf(regex, sizeof regex, "[ACGT]{%d}|.", t->opts.k);
    json_object_set_new(pat, "Regex", json_string(regex));
    json_object_set_new(pre, "pattern", pat);
    json_object_set_new(pre, "behavior", json_string("Isolated"));
    json_object_set_new(pre, "invert", json_false());
    json_object_set_new(tj, "pre_tokenizer", pre);
    json_object_set_new(tj, "post_processor", post_processor(t));
    json_t *dec = json_object();
    json_object_set_new(dec, "type", json_string("Fuse"));
    json_object_set_new(tj, "decoder", dec);
    json_t *model = json_object();
    json_object_set_new(model, "type", json_string("WordLevel"));
    json_object_set_new(model, "vocab", vocab);
    json_object_set_new(
        model, "unk_token",
        json_string(t->unk_id >= 0 ? moe_tokenizer_token_str(t, t->unk_id) : "<unk>"));
    json_object_set_new(tj, "model", model);
    if (st == MOE_OK) st = dump(tj, dir, "tokenizer.json", err);
    json_decref(tj);

    json_t *sp = json_object();
    set_special(sp, t, "bos_token", t->bos_id);
    set_special(sp, t, "eos_token", t->eos_id);
    set_special(sp, t, "pad_token", t->pad_id);
    set_special(sp, t, "unk_token", t->unk_id);
    set_special(sp, t, "mask_token", t->mask_id);
    set_special(sp, t, "sep_token", t->sep_id);
    if (st == MOE_OK) st = dump(sp, dir, "special_tokens_map.json", err);
    json_t *tc = json_deep_copy(sp);
    json_decref(sp);
    json_object_set_new(tc, "tokenizer_class", json_string("PreTrainedTokenizerFast"));
    json_object_set_new(tc, "model_max_length", json_integer(model_max_length));
    json_object_set_new(tc, "clean_up_tokenization_spaces", json_false());
    json_t *names = json_array();
    json_array_append_new(names, json_string("input_ids"));
    json_array_append_new(names, json_string("attention_mask"));
    json_object_set_new(tc, "model_input_names", names);
    if (st == MOE_OK) st = dump(tc, dir, "tokenizer_config.json", err);
    json_decref(tc);
    if (st == MOE_OK) *written = 1;
    moe_tokenizer_free(t);
    return st;
}
