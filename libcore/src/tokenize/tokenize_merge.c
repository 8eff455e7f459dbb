/* tokenize_merge: `moe-tokenize merge` - the outputs of `--part 1/N` ... `N/N` runs, read in
 * part order, written as the one output a single run would have written (same -o form and
 * --shard-tokens, so the same shard files and manifest, byte for byte).
 *
 * The one thing to know: the training and validation documents are two independent streams
 * (their shards are numbered separately), so each is copied on its own, document by
 * document, through the same output code as moe_tokenize_run (tokenize_out.c). */
#include <stdlib.h>
#include <string.h>

#include "moe/log.h"
#include "tokenize/tokenize_impl.h"

typedef struct merge {
    moe_shardset **train, **val; /* [n_parts] */
    int n_parts;
    char **sources; /* distinct document sources, the "inputs" of the output */
    int n_sources;
} merge;

static void merge_free(merge *m) {
    for (int i = 0; i < m->n_parts; i++) {
        if (m->train) moe_shardset_close(m->train[i]);
        if (m->val) moe_shardset_close(m->val[i]);
    }
    free(m->train);
    free(m->val);
    free(m->sources);
}

/* The index of source s in m->sources, added if new; -1 when out of memory. */
static int source_index(merge *m, const char *s) {
    for (int i = m->n_sources; i-- > 0;)
        if (strcmp(m->sources[i], s) == 0) return i;
    char **ns = realloc(m->sources, (size_t)(m->n_sources + 1) * sizeof *ns);
    if (!ns) return -1;
    m->sources = ns;
    ns[m->n_sources] = (char *)s; /* points into an open shard: lives as long as m */
    return m->n_sources++;
}

/* Opens every part and checks that they were tokenized alike. */
static moe_status merge_open(merge *m, const char *const *parts, int n, moe_err *err) {
    m->n_parts = n;
    m->train = calloc((size_t)n, sizeof *m->train);
    m->val = calloc((size_t)n, sizeof *m->val);
    if (!m->train || !m->val) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    for (int i = 0; i < n; i++) {
        if (moe_shardset_open(&m->train[i], parts[i], err) != MOE_OK ||
            moe_shardset_open_val(&m->val[i], parts[i], err) != MOE_OK)
            return err->status;
        const char *spec = moe_shardset_spec_json(m->train[i]);
        if (strcmp(spec, moe_shardset_spec_json(m->train[0])) != 0) {
            moe_err_set(err, MOE_ERR_INPUT, parts[i], "tokenized with other options than %s",
                        parts[0]);
            moe_err_hint(err, "merge the parts of one split: the same options, --part 1/N .. N/N");
            return MOE_ERR_INPUT;
        }
        if ((m->val[i] != NULL) != (m->val[0] != NULL)) {
            moe_err_set(err, MOE_ERR_INPUT, parts[i], "%s validation shards, unlike %s",
                        m->val[i] ? "has" : "has no", parts[0]);
            moe_err_hint(err, "every part of one split is run with the same --val-fraction");
            return MOE_ERR_INPUT;
        }
    }
    return MOE_OK;
}

/* Copies every document of set (a validation set when is_val) to out, in order. */
static moe_status copy_set(merge *m, const moe_shardset *set, int is_val, tok_out *out,
                           tok_docbuf *b, moe_err *err) {
    const moe_tokenizer *t = moe_shardset_tokenizer(set);
    int width = moe_shard_pack_width(t);
    int32_t *ids = NULL;
    int64_t ids_cap = 0;
    moe_status st = MOE_OK;
    for (int64_t s = 0; s < moe_shardset_n_shards(set) && st == MOE_OK; s++) {
        const moe_shard *sh = moe_shardset_shard(set, s);
        int mask = moe_shard_has_mask(sh);
        for (int64_t i = 0; i < moe_shard_n_docs(sh) && st == MOE_OK; i++) {
            moe_shard_doc d;
            moe_shard_get_doc(sh, i, &d);
            size_t nl = strlen(d.name) + 1;
            if (d.length > ids_cap) {
                int32_t *ni = realloc(ids, (size_t)d.length * sizeof *ids);
                if (ni) ids = ni, ids_cap = d.length;
            }
            if (d.length > ids_cap || tok_docbuf_reserve(b, d.length, width, mask, nl) < 0) {
                st = moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
                break;
            }
            moe_shard_read_tokens(sh, d.start, d.length, ids, mask ? b->lower + b->n_tokens : NULL);
            moe_shard_pack_tokens(t, ids, d.length, b->packed + b->n_tokens * width);
            tok_doc *o = &b->docs[b->n_docs++];
            o->n_tokens = d.length;
            o->src_start = d.src_start;
            o->src_end = d.src_end;
            o->strand = d.strand;
            o->name_off = b->names_len;
            o->input = source_index(m, d.source); /* known: all were collected first */
            o->is_val = is_val;
            memcpy(b->names + b->names_len, d.name, nl);
            b->names_len += nl;
            b->n_tokens += d.length;
            if ((size_t)(b->n_tokens * width) >= TOK_FLUSH_BYTES) st = tok_out_write(out, b, err);
        }
    }
    if (st == MOE_OK) st = tok_out_write(out, b, err);
    free(ids);
    return st;
}

moe_status moe_tokenize_merge(const char *const *parts, int n_parts, const char *output,
                              int64_t shard_tokens, moe_tokenize_summary *summary, moe_err *err) {
    if (summary) memset(summary, 0, sizeof *summary);
    if (n_parts < 1) {
        moe_err_set(err, MOE_ERR_INPUT, NULL, "merge needs the outputs of the parts");
        moe_err_hint(err, "moe-tokenize merge -o OUT part1.mtok part2.mtok ... (in part order)");
        return MOE_ERR_INPUT;
    }
    merge m;
    memset(&m, 0, sizeof m);
    moe_status st = merge_open(&m, parts, n_parts, err);
    tok_out *out = NULL;
    moe_tokenize_opts o;
    moe_tokenize_opts_defaults(&o);
    o.output = output;
    o.shard_tokens = shard_tokens;
    tok_docbuf b;
    memset(&b, 0, sizeof b);
    /* every document source of every part, so that tok_out sees a fixed inputs table */
    for (int i = 0; st == MOE_OK && i < n_parts; i++)
        for (int k = 0; k < 2; k++) {
            const moe_shardset *set = k ? m.val[i] : m.train[i];
            for (int64_t s = 0; set && s < moe_shardset_n_shards(set); s++) {
                const moe_shard *sh = moe_shardset_shard(set, s);
                for (int64_t d = 0; d < moe_shard_n_docs(sh) && st == MOE_OK; d++) {
                    moe_shard_doc doc;
                    moe_shard_get_doc(sh, d, &doc);
                    if (source_index(&m, doc.source) < 0)
                        st = moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
                }
            }
        }
    o.inputs = (const char *const *)m.sources;
    o.n_inputs = m.n_sources;
    if (st == MOE_OK)
        st = tok_out_open(&out, &o, moe_shardset_tokenizer(m.train[0]), m.val[0] != NULL, "tokens",
                          err);
    for (int k = 0; k < 2 && st == MOE_OK; k++)
        for (int i = 0; i < n_parts && st == MOE_OK; i++) {
            const moe_shardset *set = k ? m.val[i] : m.train[i];
            if (set) st = copy_set(&m, set, k, out, &b, err);
        }
    if (out) st = tok_out_finish(out, st, summary, err);
    tok_docbuf_free(&b);
    merge_free(&m);
    return st;
}
