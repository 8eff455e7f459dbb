/* tokenize_view: `moe-tokenize stats` and `moe-tokenize decode` - reading shards back.
 *
 * stats prints, per path (a shard, a directory or a manifest, validation companions
 * included), the counts, the per-token frequencies, a log2 histogram of document lengths
 * and the tokenizer spec, as text or JSON. decode writes every document as FASTA. The one
 * thing to know: decode restores the original case of upper+mask shards from the mask, so
 * under keep-style policies decode(tokenize(x)) has exactly the bases of x. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "moe/shard.h"
#include "moe/tokenize.h"

#define N_HIST 40

typedef struct counts {
    int64_t docs, tokens, lower, min_len, max_len;
    int64_t hist[N_HIST]; /* hist[b]: documents with length in [2^b, 2^(b+1)) */
    int64_t *freq;        /* [vocab] */
} counts;

static void count_set(const moe_shardset *set, counts *c) {
    for (int64_t k = 0; k < moe_shardset_n_shards(set); k++) {
        const moe_shard *s = moe_shardset_shard(set, k);
        int64_t nt = moe_shard_n_tokens(s);
        for (int64_t i = 0; i < nt; i++) {
            c->freq[moe_shard_token(s, i)]++;
            c->lower += moe_shard_token_is_lower(s, i);
        }
        c->tokens += nt;
        for (int64_t d = 0; d < moe_shard_n_docs(s); d++) {
            moe_shard_doc doc;
            moe_shard_get_doc(s, d, &doc);
            int b = 0;
            while (b < N_HIST - 1 && (doc.length >> (b + 1)) > 0)
                b++;
            c->hist[b]++;
            if (c->docs == 0 || doc.length < c->min_len) c->min_len = doc.length;
            if (doc.length > c->max_len) c->max_len = doc.length;
            c->docs++;
        }
    }
}

static json_t *counts_json(const counts *c, const moe_tokenizer *t, const moe_shardset *set) {
    json_t *freq = json_object(), *hist = json_array(), *files = json_array();
    for (int64_t i = 0; i < t->vocab_size; i++)
        if (c->freq[i])
            json_object_set_new(freq, moe_tokenizer_token_str(t, (int32_t)i),
                                json_integer(c->freq[i]));
    for (int b = 0; b < N_HIST; b++)
        if (c->hist[b])
            json_array_append_new(hist, json_pack("{s:I, s:I, s:I}", "min", (json_int_t)1 << b,
                                                  "max", ((json_int_t)2 << b) - 1, "docs",
                                                  (json_int_t)c->hist[b]));
    for (int64_t k = 0; k < moe_shardset_n_shards(set); k++)
        json_array_append_new(files, json_string(moe_shard_path(moe_shardset_shard(set, k))));
    return json_pack("{s:o, s:I, s:I, s:I, s:I, s:I, s:o, s:o}", "files", files, "documents",
                     (json_int_t)c->docs, "tokens", (json_int_t)c->tokens, "lowercase_tokens",
                     (json_int_t)c->lower, "min_length", (json_int_t)c->min_len, "max_length",
                     (json_int_t)c->max_len, "token_counts", freq, "length_histogram", hist);
}

static void counts_text(const counts *c, const moe_tokenizer *t, const moe_shardset *set,
                        const char *label, FILE *out) {
    fprintf(out, "%s\n", label);
    for (int64_t k = 0; k < moe_shardset_n_shards(set); k++)
        fprintf(out, "  file\t%s\n", moe_shard_path(moe_shardset_shard(set, k)));
    fprintf(out, "  documents\t%lld\n  tokens\t%lld\n", (long long)c->docs, (long long)c->tokens);
    if (moe_shard_has_mask(moe_shardset_shard(set, 0)))
        fprintf(out, "  lowercase_tokens\t%lld\n", (long long)c->lower);
    if (c->docs)
        fprintf(out, "  length min/mean/max\t%lld\t%.1f\t%lld\n", (long long)c->min_len,
                (double)c->tokens / (double)c->docs, (long long)c->max_len);
    fprintf(out, "  token counts (id, token, count, fraction)\n");
    for (int64_t i = 0; i < t->vocab_size; i++)
        if (c->freq[i])
            fprintf(out, "    %lld\t%s\t%lld\t%.6f\n", (long long)i,
                    moe_tokenizer_token_str(t, (int32_t)i), (long long)c->freq[i],
                    (double)c->freq[i] / (double)c->tokens);
    fprintf(out, "  document lengths (tokens: documents)\n");
    for (int b = 0; b < N_HIST; b++)
        if (c->hist[b])
            fprintf(out, "    %lld-%lld\t%lld\n", 1LL << b, (2LL << b) - 1, (long long)c->hist[b]);
}

moe_status moe_tokenize_stats(const char *const *paths, int n_paths, int json, FILE *out,
                              moe_err *err) {
    json_t *all = json ? json_array() : NULL;
    moe_status st = MOE_OK;
    for (int p = 0; p < n_paths && st == MOE_OK; p++) {
        for (int val = 0; val < 2 && st == MOE_OK; val++) {
            moe_shardset *set = NULL;
            st = val ? moe_shardset_open_val(&set, paths[p], err)
                     : moe_shardset_open(&set, paths[p], err);
            if (st != MOE_OK || !set) break;
            const moe_tokenizer *t = moe_shardset_tokenizer(set);
            counts c;
            memset(&c, 0, sizeof c);
            c.freq = calloc((size_t)t->vocab_size, sizeof *c.freq);
            if (!c.freq) {
                moe_shardset_close(set);
                st = moe_err_set(err, MOE_ERR_RUNTIME, paths[p], "out of memory");
                break;
            }
            count_set(set, &c);
            if (json) {
                json_error_t je;
                json_t *o = counts_json(&c, t, set);
                json_object_set_new(o, "path", json_string(paths[p]));
                json_object_set_new(o, "split", json_string(val ? "val" : "train"));
                json_object_set_new(o, "tokenizer",
                                    json_loads(moe_shardset_spec_json(set), 0, &je));
                json_array_append_new(all, o);
            } else {
                char label[4200];
                snprintf(label, sizeof label, "%s%s", paths[p], val ? " (validation)" : "");
                counts_text(&c, t, set, label, out);
                fprintf(out, "  tokenizer\t%s\n", moe_shardset_spec_json(set));
            }
            free(c.freq);
            moe_shardset_close(set);
        }
    }
    if (json && st == MOE_OK) {
        json_dumpf(all, out, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        fputc('\n', out);
    }
    json_decref(all);
    if (st == MOE_OK && fflush(out) != 0) st = moe_err_errno(err, "(stdout)", "write failed");
    return st;
}

moe_status moe_tokenize_decode(const char *path, int width, FILE *out, moe_err *err) {
    moe_shardset *set = NULL;
    if (moe_shardset_open(&set, path, err) != MOE_OK) return err->status;
    const moe_tokenizer *t = moe_shardset_tokenizer(set);
    int32_t *ids = NULL;
    uint8_t *lower = NULL;
    char *bases = NULL;
    int64_t cap = 0;
    moe_status st = MOE_OK;
    for (int64_t k = 0; k < moe_shardset_n_shards(set) && st == MOE_OK; k++) {
        const moe_shard *s = moe_shardset_shard(set, k);
        for (int64_t d = 0; d < moe_shard_n_docs(s) && st == MOE_OK; d++) {
            moe_shard_doc doc;
            moe_shard_get_doc(s, d, &doc);
            if (doc.length > cap) {
                cap = doc.length;
                free(ids);
                free(lower);
                free(bases);
                ids = malloc((size_t)cap * sizeof *ids);
                lower = malloc((size_t)cap);
                bases = malloc((size_t)cap * (size_t)moe_tokenizer_max_bases_per_token(t) + 1);
                if (!ids || !lower || !bases) {
                    st = moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory");
                    break;
                }
            }
            moe_shard_read_tokens(s, doc.start, doc.length, ids, lower);
            int64_t nb = moe_tokenizer_decode(t, ids, lower, doc.length, bases);
            fprintf(out, ">%s range=%lld-%lld strand=%c\n", doc.name, (long long)doc.src_start + 1,
                    (long long)doc.src_end, doc.strand);
            for (int64_t i = 0; i<nb; i += width> 0 ? width : nb) {
                int64_t m = width > 0 && nb - i > width ? width : nb - i;
                fwrite(bases + i, 1, (size_t)m, out);
                fputc('\n', out);
            }
            if (ferror(out)) st = moe_err_errno(err, "(stdout)", "write failed");
        }
    }
    free(ids);
    free(lower);
    free(bases);
    moe_shardset_close(set);
    if (st == MOE_OK && fflush(out) != 0) st = moe_err_errno(err, "(stdout)", "write failed");
    return st;
}
