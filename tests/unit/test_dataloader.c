/* test_dataloader: samples are windows of the packed document stream (EOS between
 * documents, whether the shards carry it or the loader inserts it), each token is a target
 * once per epoch, the shuffled order is a deterministic per-epoch permutation, a saved
 * position resumes the exact sample sequence, PAD targets are ignored and lower-case targets
 * get data.lowercase_weight; under the document mask the targets of EOS positions are
 * ignored (both EOS origins), and turning it off again restores the plain windows; too little
 * data and a vocabulary mismatch are clear errors. */
#include <stdlib.h>
#include <string.h>

#include "moe/dataloader.h"
#include "moe/fileio.h"
#include "moe/shard.h"
#include "moe/tokenizer.h"
#include "testlib.h"

#define MAXS 4096

/* Writes docs (NUL-terminated strings) into path with tokenizer t; appends every token of
 * the stream (with the loader's inserted EOS when sep >= 0) to stream/lower. */
static void write_shard(const char *path, const moe_tokenizer *t, const char *const *docs, int n,
                        int32_t sep, int32_t *stream, uint8_t *lower, int64_t *len) {
    moe_err err;
    moe_err_clear(&err);
    moe_shard_writer *w;
    if (moe_shard_writer_open(&w, path, t, &err) != MOE_OK) {
        CHECK_MSG(0, "writer: %s", err.msg);
        return;
    }
    moe_token_buf b;
    memset(&b, 0, sizeof b);
    for (int i = 0; i < n; i++) {
        b.n = 0;
        CHECK(moe_tokenizer_encode_doc(t, docs[i], (int64_t)strlen(docs[i]), &b, &err) == MOE_OK);
        moe_shard_doc d;
        memset(&d, 0, sizeof d);
        char name[32];
        snprintf(name, sizeof name, "doc%d", i);
        d.name = name;
        d.source = "test";
        d.strand = '+';
        d.src_end = (int64_t)strlen(docs[i]);
        CHECK(moe_shard_writer_add(w, b.ids, b.lower, b.n, &d, &err) == MOE_OK);
        for (int64_t k = 0; k < b.n; k++) {
            stream[*len] = b.ids[k];
            lower[(*len)++] = b.lower ? b.lower[k] : 0;
        }
        if (sep >= 0) stream[*len] = sep, lower[(*len)++] = 0;
    }
    CHECK_MSG(moe_shard_writer_commit(w, &err) == MOE_OK, "commit: %s", err.msg);
    moe_token_buf_free(&b);
}

static const char *const docs_a[] = {"ACGTACGTAC", "GGGCCCAAATTT", "ACGNNNTTAGC", "T"};
static const char *const docs_b[] = {"AAAACCCCGGGGTTTTAAAACCCC", "acgtACGTacgt", "CCGGAATT"};

static void check_windows(moe_dataloader *dl, const int32_t *stream, int64_t len, int64_t T) {
    CHECK_INT_EQ(dl->stream_tokens, len);
    CHECK_INT_EQ(dl->n_samples, (len - 1) / T);
    int32_t tok[64], tgt[64];
    for (int64_t s = 0; s < dl->n_samples; s++) {
        moe_dataloader_get(dl, s, tok, tgt, NULL);
        int ok = 1;
        for (int64_t t = 0; t < T; t++)
            ok &= tok[t] == stream[s * T + t] && tgt[t] == stream[s * T + t + 1];
        CHECK_MSG(ok, "window %lld differs from the packed stream", (long long)s);
    }
}

/* Under the document mask: tokens are the stream's, targets the next token, -1 at EOS
 * positions and PAD targets (pad -1: none). Returns how many EOS targets were ignored. */
static int check_doc_targets(moe_dataloader *dl, const int32_t *stream, int64_t T, int32_t eos,
                             int32_t pad) {
    int32_t tok[64], tgt[64];
    int n_eos = 0;
    for (int64_t s = 0; s < dl->n_samples; s++) {
        moe_dataloader_get(dl, s, tok, tgt, NULL);
        int ok = 1;
        for (int64_t t = 0; t < T; t++) {
            int32_t x = stream[s * T + t], y = stream[s * T + t + 1];
            ok &= tok[t] == x && tgt[t] == (x == eos || y == pad ? -1 : y);
            n_eos += x == eos;
        }
        CHECK_MSG(ok, "window %lld: targets under the document mask", (long long)s);
    }
    return n_eos;
}

int main(void) {
    moe_err err;
    moe_err_clear(&err);
    moe_remove_tree("d1", &err);
    moe_remove_tree("d2", &err);
    moe_mkdirs("d1", &err);
    moe_mkdirs("d2", &err);

    /* 1. Documents carry EOS (tokenizer add_eos): the stream is the shards' tokens. */
    moe_tokenizer_opts o;
    moe_tokenizer_opts_defaults(&o, MOE_TOKENIZER_BYTE);
    o.case_policy = MOE_CASE_UPPER_MASK;
    moe_tokenizer *t = NULL;
    if (moe_tokenizer_create(&t, &o, &err) != MOE_OK) {
        CHECK_MSG(0, "tokenizer: %s", err.msg);
        return test_summary("dataloader");
    }
    static int32_t stream[MAXS];
    static uint8_t lower[MAXS];
    int64_t len = 0;
    write_shard("d1/a.mtok", t, docs_a, 4, -1, stream, lower, &len);
    write_shard("d1/b.mtok", t, docs_b, 3, -1, stream, lower, &len);
    CHECK(stream[9 + 1] == t->eos_id); /* the first document ends with EOS */
    moe_shardset *set = NULL;
    CHECK_MSG(moe_shardset_open(&set, "d1", &err) == MOE_OK, "%s", err.msg);
    if (!set) return test_summary("dataloader");
    const int64_t T = 7;
    moe_dataloader dl;
    CHECK(moe_dataloader_init(&dl, set, T, 0, 1, 1.0, "test data", &err) == MOE_OK);
    CHECK_INT_EQ(dl.sep_id, -1);
    CHECK_INT_EQ(dl.doc_sep, -1); /* the mask is off until the trainer turns it on */
    check_windows(&dl, stream, len, T);
    moe_dataloader_set_document_mask(&dl, 1);
    CHECK_INT_EQ(dl.doc_sep, t->eos_id);
    CHECK(check_doc_targets(&dl, stream, T, t->eos_id, -1) >= 5);
    moe_dataloader_set_document_mask(&dl, 0);
    check_windows(&dl, stream, len, T);
    /* No shuffling: samples in order, then the next epoch starts over. */
    int32_t tok[4 * 7], tgt[4 * 7];
    int64_t e, i;
    for (int64_t s = 0; s < dl.n_samples; s++)
        moe_dataloader_next(&dl, 1, tok, tgt, NULL);
    moe_dataloader_position(&dl, &e, &i);
    CHECK(e == 0 && i == dl.n_samples);
    moe_dataloader_next(&dl, 1, tok, tgt, NULL);
    moe_dataloader_position(&dl, &e, &i);
    CHECK(e == 1 && i == 1);
    CHECK(tok[0] == stream[0]);
    moe_dataloader_free(&dl);

    /* 2. Lower-case weights (upper+mask shards) on targets from lower-case bases. */
    float wts[7];
    CHECK(moe_dataloader_init(&dl, set, T, 0, 1, 0.25, "test data", &err) == MOE_OK);
    CHECK(dl.use_weights == 1);
    int n_low = 0;
    for (int64_t s = 0; s < dl.n_samples; s++) {
        moe_dataloader_get(&dl, s, tok, tgt, wts);
        for (int64_t k = 0; k < T; k++) {
            float want = lower[s * T + k + 1] ? 0.25f : 1.0f;
            CHECK(wts[k] == want);
            n_low += lower[s * T + k + 1];
        }
    }
    CHECK(n_low >= 6); /* "acgt" + "acgt" of docs_b[1] (those inside whole windows) */
    moe_dataloader_free(&dl);

    /* 3. Shuffled order: a permutation per epoch, the same for the same seed, different for
     * another seed and another epoch; position restore continues the exact sequence. */
    CHECK(moe_dataloader_init(&dl, set, T, 1, 42, 1.0, "test data", &err) == MOE_OK);
    int64_t n = dl.n_samples;
    CHECK(n >= 8);
    char seen[MAXS];
    int same_as_identity = 1, same_epoch1 = 1;
    memset(seen, 0, sizeof seen);
    for (int64_t k = 0; k < n; k++) {
        int64_t s = moe_dataloader_sample_at(&dl, 0, k);
        CHECK(s >= 0 && s < n);
        if (s >= 0 && s < n) seen[s]++;
        same_as_identity &= s == k;
        same_epoch1 &= s == moe_dataloader_sample_at(&dl, 1, k);
    }
    int perm = 1;
    for (int64_t k = 0; k < n; k++)
        perm &= seen[k] == 1;
    CHECK_MSG(perm, "epoch order is not a permutation of the %lld windows", (long long)n);
    CHECK(!same_as_identity);
    CHECK(!same_epoch1);
    moe_dataloader other;
    CHECK(moe_dataloader_init(&other, set, T, 1, 43, 1.0, "test data", &err) == MOE_OK);
    int same_seed43 = 1;
    for (int64_t k = 0; k < n; k++)
        same_seed43 &=
            moe_dataloader_sample_at(&dl, 0, k) == moe_dataloader_sample_at(&other, 0, k);
    CHECK(!same_seed43);
    moe_dataloader_free(&other);
    /* Permutations of awkward sizes stay permutations. */
    for (int64_t m = 1; m <= 300; m += 37) {
        moe_dataloader p = dl;
        p.n_samples = m;
        memset(seen, 0, sizeof seen);
        for (int64_t k = 0; k < m; k++)
            seen[moe_dataloader_sample_at(&p, 3, k)]++;
        int ok = 1;
        for (int64_t k = 0; k < m; k++)
            ok &= seen[k] == 1;
        CHECK_MSG(ok, "not a permutation for n = %lld", (long long)m);
    }
    /* Resume: run 5 batches of 3 (crossing an epoch), save, continue 4 more; a fresh loader
     * set to the saved position yields the same 4 batches. */
    for (int k = 0; k < 5; k++)
        moe_dataloader_next(&dl, 3, tok, tgt, NULL);
    moe_dataloader_position(&dl, &e, &i);
    CHECK(e * n + i == 15);
    int32_t a[4][3 * 7], b2[3 * 7], tg[3 * 7];
    for (int k = 0; k < 4; k++)
        moe_dataloader_next(&dl, 3, a[k], tg, NULL);
    CHECK(moe_dataloader_init(&other, set, T, 1, 42, 1.0, "test data", &err) == MOE_OK);
    CHECK(moe_dataloader_set_position(&other, e, i, &err) == MOE_OK);
    for (int k = 0; k < 4; k++) {
        moe_dataloader_next(&other, 3, b2, tg, NULL);
        CHECK_MSG(memcmp(a[k], b2, sizeof b2) == 0, "batch %d after resume differs", k);
    }
    CHECK(moe_dataloader_set_position(&other, 0, n + 1, &err) == MOE_ERR_INPUT);
    moe_dataloader_free(&other);
    moe_dataloader_free(&dl);

    /* 4. Vocabulary check names the data, the tokenizer and both sizes. */
    moe_err_clear(&err);
    CHECK(moe_dataloader_check_vocab(set, "d1", 256, &err) == MOE_OK);
    CHECK(moe_dataloader_check_vocab(set, "d1", 512, &err) == MOE_ERR_INPUT);
    CHECK(strstr(err.msg, "byte") && strstr(err.msg, "256") && strstr(err.msg, "512"));
    CHECK(strcmp(err.file, "d1") == 0);
    /* Too little data for one window. */
    moe_err_clear(&err);
    CHECK(moe_dataloader_init(&dl, set, len, 0, 1, 1.0, "test data", &err) == MOE_ERR_INPUT);
    CHECK(strstr(err.msg, "seq_len") != NULL);
    moe_shardset_close(set);
    moe_tokenizer_free(t);

    /* 5. Tokenizer without add_eos: the loader inserts EOS after every document; PAD
     * targets are ignored. */
    moe_tokenizer_opts_defaults(&o, MOE_TOKENIZER_BYTE);
    o.add_eos = 0;
    CHECK(moe_tokenizer_create(&t, &o, &err) == MOE_OK);
    len = 0;
    write_shard("d2/a.mtok", t, docs_a, 4, t->eos_id, stream, lower, &len);
    moe_shard_writer *w;
    CHECK(moe_shard_writer_open(&w, "d2/c.mtok", t, &err) == MOE_OK);
    int32_t padded[6] = {'A', 'C', t->pad_id, t->pad_id, 'G', 'T'};
    moe_shard_doc d;
    memset(&d, 0, sizeof d);
    d.name = "padded";
    d.source = "test";
    d.strand = '+';
    CHECK(moe_shard_writer_add(w, padded, NULL, 6, &d, &err) == MOE_OK);
    CHECK(moe_shard_writer_commit(w, &err) == MOE_OK);
    for (int k = 0; k < 6; k++)
        stream[len] = padded[k], lower[len++] = 0;
    stream[len] = t->eos_id, lower[len++] = 0;
    CHECK(moe_shardset_open(&set, "d2", &err) == MOE_OK);
    CHECK(moe_dataloader_init(&dl, set, 5, 0, 1, 1.0, "test data", &err) == MOE_OK);
    CHECK_INT_EQ(dl.sep_id, t->eos_id);
    int32_t tk[5], tt[5];
    int n_pad = 0;
    for (int64_t s = 0; s < dl.n_samples; s++) {
        moe_dataloader_get(&dl, s, tk, tt, NULL);
        for (int k = 0; k < 5; k++) {
            int32_t want = stream[s * 5 + k + 1];
            if (want == t->pad_id) {
                CHECK(tt[k] == -1);
                n_pad++;
            } else {
                CHECK(tt[k] == want && tk[k] == stream[s * 5 + k]);
            }
        }
    }
    int want_pad = 0;
    for (int64_t k = 1; k <= dl.n_samples * 5; k++)
        want_pad += stream[k] == t->pad_id;
    CHECK(want_pad >= 1);
    CHECK_INT_EQ(n_pad, want_pad);
    moe_dataloader_set_document_mask(&dl, 1); /* inserted EOS positions are ignored too */
    CHECK(check_doc_targets(&dl, stream, 5, t->eos_id, t->pad_id) >= 4);
    moe_dataloader_free(&dl);
    moe_shardset_close(set);
    moe_tokenizer_free(t);
    moe_remove_tree("d1", &err);
    moe_remove_tree("d2", &err);
    return test_summary("dataloader");
}
