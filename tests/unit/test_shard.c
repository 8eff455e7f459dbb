/* test_shard: .mtok write -> read round trips (1-, 2- and 4-byte tokens, lower-case mask,
 * document index), the byte layout promised in docs/formats.md, rejection of every kind of
 * damage (magic, version, truncation at many lengths, index, out-of-vocabulary ids), and
 * shard sets (directory, manifest, validation companions, memory/stream opening). */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "moe/fileio.h"
#include "moe/shard.h"
#include "testlib.h"

static moe_tokenizer *make(moe_tokenizer_kind kind, int k, moe_case_policy cp) {
    moe_tokenizer_opts o;
    moe_tokenizer_opts_defaults(&o, kind);
    if (kind == MOE_TOKENIZER_KMER) o.k = k;
    o.case_policy = cp;
    if (kind == MOE_TOKENIZER_NUC && cp != MOE_CASE_KEEP) o.iupac = MOE_IUPAC_TO_N;
    moe_tokenizer *t = NULL;
    moe_err err;
    moe_err_clear(&err);
    CHECK_MSG(moe_tokenizer_create(&t, &o, &err) == MOE_OK, "%s", err.msg);
    return t;
}

static const char *SEQS[3] = {"ACGTacgtNNAC", "GATTACA", "ttttttttttACGTTGCAAC"};
static const char *NAMES[3] = {"chr1", "read/2", "contig_3"};

/* Writes SEQS as three documents; returns total tokens. */
static int64_t write_shard(const char *path, const moe_tokenizer *t) {
    moe_err err;
    moe_err_clear(&err);
    moe_shard_writer *w = NULL;
    CHECK_MSG(moe_shard_writer_open(&w, path, t, &err) == MOE_OK, "%s", err.msg);
    if (!w) return 0;
    moe_token_buf b = {0};
    int64_t total = 0;
    for (int i = 0; i < 3; i++) {
        b.n = 0;
        CHECK(moe_tokenizer_encode_doc(t, SEQS[i], (int64_t)strlen(SEQS[i]), &b, &err) == MOE_OK);
        moe_shard_doc d = {0};
        d.name = NAMES[i];
        d.source = i < 2 ? "a.fa" : "b.fq.gz";
        d.src_start = 10 * i;
        d.src_end = 10 * i + (int64_t)strlen(SEQS[i]);
        d.strand = i == 1 ? '-' : '+';
        CHECK(moe_shard_writer_add(w, b.ids, b.lower, b.n, &d, &err) == MOE_OK);
        total += b.n;
    }
    CHECK_INT_EQ(moe_shard_writer_n_tokens(w), total);
    CHECK_MSG(moe_shard_writer_commit(w, &err) == MOE_OK, "%s", err.msg);
    moe_token_buf_free(&b);
    return total;
}

static void check_shard(const moe_shard *s, const moe_tokenizer *t, int64_t total) {
    CHECK_INT_EQ(moe_shard_n_tokens(s), total);
    CHECK_INT_EQ(moe_shard_n_docs(s), 3);
    CHECK_INT_EQ(moe_shard_vocab_size(s), t->vocab_size);
    CHECK(moe_shard_vocab_hash(s) == t->vocab_hash);
    CHECK(strcmp(moe_shard_spec_json(s), moe_tokenizer_spec_json(t)) == 0);
    int width = t->vocab_size <= 256 ? 1 : t->vocab_size <= 65536 ? 2 : 4;
    CHECK_INT_EQ(moe_shard_token_width(s), width);
    CHECK_INT_EQ(moe_shard_has_mask(s), t->opts.case_policy == MOE_CASE_UPPER_MASK);
    moe_token_buf b = {0};
    moe_err err;
    moe_err_clear(&err);
    int64_t off = 0;
    for (int i = 0; i < 3; i++) {
        moe_shard_doc d;
        moe_shard_get_doc(s, i, &d);
        b.n = 0;
        moe_tokenizer_encode_doc(t, SEQS[i], (int64_t)strlen(SEQS[i]), &b, &err);
        CHECK_INT_EQ(d.start, off);
        CHECK_INT_EQ(d.length, b.n);
        CHECK(strcmp(d.name, NAMES[i]) == 0);
        CHECK(strcmp(d.source, i < 2 ? "a.fa" : "b.fq.gz") == 0);
        CHECK_INT_EQ(d.src_start, 10 * i);
        CHECK_INT_EQ(d.strand, i == 1 ? '-' : '+');
        int32_t *ids = malloc((size_t)d.length * sizeof *ids);
        uint8_t *lo = malloc((size_t)d.length);
        moe_shard_read_tokens(s, d.start, d.length, ids, lo);
        for (int64_t j = 0; j < b.n; j++) {
            CHECK_INT_EQ(ids[j], b.ids[j]);
            CHECK_INT_EQ(moe_shard_token(s, d.start + j), b.ids[j]);
            int want_lower = moe_shard_has_mask(s) ? b.lower[j] : 0;
            CHECK_INT_EQ(lo[j], want_lower);
            CHECK_INT_EQ(moe_shard_token_is_lower(s, d.start + j), want_lower);
            CHECK_INT_EQ(moe_shard_find_doc(s, d.start + j), i);
        }
        free(ids);
        free(lo);
        off += d.length;
    }
    moe_token_buf_free(&b);
}

static void test_roundtrips(void) {
    struct {
        moe_tokenizer_kind kind;
        int k;
        moe_case_policy cp;
    } cases[] = {
        {MOE_TOKENIZER_BYTE, 0, MOE_CASE_KEEP},
        {MOE_TOKENIZER_NUC, 0, MOE_CASE_UPPER_MASK},
        {MOE_TOKENIZER_KMER, 6, MOE_CASE_UPPER_MASK},
        {MOE_TOKENIZER_KMER, 8, MOE_CASE_UPPER},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        moe_tokenizer *t = make(cases[c].kind, cases[c].k, cases[c].cp);
        if (!t) continue;
        int64_t total = write_shard("rt.mtok", t);
        moe_shard *s = NULL;
        moe_err err;
        moe_err_clear(&err);
        CHECK_MSG(moe_shard_open(&s, "rt.mtok", &err) == MOE_OK, "case %zu: %s", c, err.msg);
        if (s) {
            check_shard(s, t, total);
            moe_shard_close(s);
        }
        /* the same bytes through a pipe-like stream */
        FILE *fp = fopen("rt.mtok", "rb");
        CHECK(moe_shard_open_stream(&s, fp, "stream", &err) == MOE_OK);
        fclose(fp);
        if (s) {
            check_shard(s, t, total);
            moe_shard_close(s);
        }
        moe_tokenizer_free(t);
    }
}

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    *n = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *d = malloc(*n);
    if (fread(d, 1, *n, fp) != *n) *n = 0;
    fclose(fp);
    return d;
}

static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Opens a modified copy; returns the status. */
static moe_status open_copy(const uint8_t *d, size_t n, moe_err *err) {
    uint8_t *c = malloc(n ? n : 1);
    memcpy(c, d, n);
    moe_shard *s = NULL;
    moe_err_clear(err);
    moe_status st = moe_shard_open_memory(&s, c, n, 1, "damaged.mtok", err);
    moe_shard_close(s);
    return st;
}

static void test_layout_and_damage(void) {
    moe_tokenizer *t = make(MOE_TOKENIZER_NUC, 0, MOE_CASE_UPPER_MASK);
    if (!t) return;
    int64_t total = write_shard("lay.mtok", t);
    size_t n = 0;
    uint8_t *d = slurp("lay.mtok", &n);
    if (!d || n < 112) {
        CHECK(0);
        return;
    }
    /* header fields as documented */
    CHECK(memcmp(d, "MOETOK\0\1", 8) == 0);
    CHECK_INT_EQ(d[8], 1); /* version */
    size_t spec_len = strlen(moe_tokenizer_spec_json(t));
    uint64_t hsize = d[12] | (d[13] << 8) | ((uint64_t)d[14] << 16);
    CHECK_INT_EQ(hsize, (80 + spec_len + 7) / 8 * 8);
    CHECK_INT_EQ(d[16], MOE_TOKENIZER_NUC);
    CHECK_INT_EQ(d[20], 1); /* width */
    CHECK_INT_EQ(get64(d + 40), total);
    CHECK_INT_EQ(get64(d + 48), 3);
    CHECK_INT_EQ(d[64], 3); /* mask | counts */
    CHECK(memcmp(d + 80, moe_tokenizer_spec_json(t), spec_len) == 0);
    CHECK(memcmp(d + n - 8, "MOETEND\0", 8) == 0);
    CHECK_INT_EQ(get64(d + n - 32), get64(d + 56)); /* trailer index offset = header's */
    /* tokens start right after the header: the first document's first base is 'A' (id 5) */
    CHECK_INT_EQ(d[hsize], 5);

    moe_err err;
    CHECK(open_copy(d, n, &err) == MOE_OK);
    d[0] ^= 1;
    CHECK(open_copy(d, n, &err) == MOE_ERR_INPUT && strstr(err.msg, "magic"));
    CHECK(strcmp(err.file, "damaged.mtok") == 0);
    d[0] ^= 1;
    d[8] = 2;
    CHECK(open_copy(d, n, &err) == MOE_ERR_INPUT && strstr(err.msg, "version"));
    d[8] = 1;
    /* every truncation is refused */
    int refused = 0, tried = 0;
    for (size_t cut = 0; cut < n; cut += cut < 200 ? 1 : 7) {
        tried++;
        refused += open_copy(d, cut, &err) == MOE_ERR_INPUT;
    }
    CHECK_INT_EQ(refused, tried);
    /* a token id outside the vocabulary (nuc compact: 16) */
    uint8_t keep = d[hsize + 1];
    d[hsize + 1] = 200;
    CHECK(open_copy(d, n, &err) == MOE_ERR_INPUT && strstr(err.msg, "outside the vocabulary"));
    d[hsize + 1] = keep;
    /* a document start that breaks contiguity */
    uint64_t ix = get64(d + 56);
    uint8_t *doc1 = d + ix + 32 + 48;
    doc1[0] ^= 1;
    CHECK(open_copy(d, n, &err) == MOE_ERR_INPUT && strstr(err.msg, "checksum"));
    /* ... and with a matching checksum, the contiguity check catches it */
    uint64_t body = 48 * get64(d + ix) + 8 * get64(d + ix + 8) + get64(d + ix + 16);
    uint8_t crc_saved[4];
    memcpy(crc_saved, d + ix + 24, 4);
    uint32_t crc = moe_crc32(0, d + ix + 32, body);
    for (int i = 0; i < 4; i++)
        d[ix + 24 + i] = (uint8_t)(crc >> (8 * i));
    CHECK(open_copy(d, n, &err) == MOE_ERR_INPUT && strstr(err.msg, "contiguous"));
    doc1[0] ^= 1;
    memcpy(d + ix + 24, crc_saved, 4);
    /* a header count disagreeing with the trailer */
    d[40] ^= 1;
    CHECK(open_copy(d, n, &err) == MOE_ERR_INPUT);
    d[40] ^= 1;
    /* the spec must rebuild into the same vocabulary */
    uint8_t *v = (uint8_t *)strstr((char *)d + 80, "\"case\":\"upper+mask\"");
    if (v) {
        uint8_t saved[19];
        memcpy(saved, v, 19);
        memcpy(v, "\"case\":\"upper\"     ", 19);
        CHECK(open_copy(d, n, &err) == MOE_ERR_INPUT);
        memcpy(v, saved, 19);
    }
    CHECK(open_copy(d, n, &err) == MOE_OK); /* every damage above was undone */
    /* random single-byte damage anywhere: never a crash (ASan/UBSan builds check that), and a
       damaged header, index (CRC) or trailer is refused */
    uint64_t rng = 0x9E3779B97F4A7C15ULL;
    int accepted_outside_tokens = 0;
    for (int trial = 0; trial < 3000; trial++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        size_t at = (size_t)(rng % n);
        uint8_t old = d[at];
        d[at] = (uint8_t)(old ^ (1u + (uint8_t)(rng >> 32) % 255u));
        moe_status st = open_copy(d, n, &err);
        int in_tokens_or_padding = at >= hsize && at < get64(d + 56);
        int in_spec_text = at >= 80 && at < hsize; /* may still be equivalent JSON */
        if (st == MOE_OK && !in_tokens_or_padding && !in_spec_text) {
            /* only the reserved header bytes and the padding after the names may change
               harmlessly: the index is covered by its CRC, the rest by the checks */
            uint64_t io = get64(d + 56), str_end = io + 32 + 48 * get64(d + io) +
                                                   8 * get64(d + io + 8) + get64(d + io + 16);
            int harmless = (at >= 72 && at < 80) || (at >= str_end && at < n - 32);
            if (!harmless) accepted_outside_tokens++;
        }
        d[at] = old;
    }
    CHECK_INT_EQ(accepted_outside_tokens, 0);
    free(d);
    moe_err_clear(&err);
    moe_shard *s = NULL;
    CHECK(moe_shard_open(&s, "no-such.mtok", &err) == MOE_ERR_INPUT && !s);
    moe_tokenizer_free(t);
}

static void test_sets(void) {
    moe_tokenizer *t = make(MOE_TOKENIZER_BYTE, 0, MOE_CASE_KEEP);
    if (!t) return;
    mkdir("set", 0755);
    int64_t a = write_shard("set/shard-00000.mtok", t);
    int64_t b = write_shard("set/shard-00001.mtok", t);
    int64_t v = write_shard("set/shard-00000.val.mtok", t);
    moe_err err;
    moe_err_clear(&err);
    moe_shardset *set = NULL, *val = NULL;
    CHECK_MSG(moe_shardset_open(&set, "set", &err) == MOE_OK, "%s", err.msg);
    CHECK_MSG(moe_shardset_open_val(&val, "set", &err) == MOE_OK, "%s", err.msg);
    if (set) {
        CHECK_INT_EQ(moe_shardset_n_shards(set), 2);
        CHECK_INT_EQ(moe_shardset_n_tokens(set), a + b);
        CHECK_INT_EQ(moe_shardset_n_docs(set), 6);
        CHECK(strstr(moe_shard_path(moe_shardset_shard(set, 1)), "shard-00001.mtok") != NULL);
        CHECK(moe_shardset_tokenizer(set)->vocab_hash == t->vocab_hash);
    }
    if (val) CHECK_INT_EQ(moe_shardset_n_tokens(val), v);
    CHECK(val != NULL);
    moe_shardset_close(set);
    moe_shardset_close(val);
    /* a single file and its companion */
    write_shard("one.mtok", t);
    write_shard("one.val.mtok", t);
    CHECK(moe_shardset_open(&set, "one.mtok", &err) == MOE_OK);
    CHECK(moe_shardset_open_val(&val, "one.mtok", &err) == MOE_OK && val);
    moe_shardset_close(set);
    moe_shardset_close(val);
    CHECK(moe_shardset_open_val(&val, "rt.mtok", &err) == MOE_OK && !val);
    /* a manifest */
    FILE *fp = fopen("set/manifest.json", "w");
    fputs("{\"format\": \"moe-token-shards\", \"version\": 1, \"shards\": [{\"path\": "
          "\"shard-00001.mtok\"}], \"val_shards\": []}\n",
          fp);
    fclose(fp);
    CHECK_MSG(moe_shardset_open(&set, "set/manifest.json", &err) == MOE_OK, "%s", err.msg);
    if (set) CHECK_INT_EQ(moe_shardset_n_tokens(set), b);
    moe_shardset_close(set);
    /* mixing tokenizers is refused */
    moe_tokenizer *u = make(MOE_TOKENIZER_NUC, 0, MOE_CASE_KEEP);
    mkdir("mixed", 0755);
    write_shard("mixed/a.mtok", t);
    write_shard("mixed/b.mtok", u);
    moe_err_clear(&err);
    CHECK(moe_shardset_open(&set, "mixed", &err) == MOE_ERR_INPUT && !set);
    mkdir("empty", 0755);
    moe_err_clear(&err);
    CHECK(moe_shardset_open(&set, "empty", &err) == MOE_ERR_INPUT && !set);
    moe_tokenizer_free(u);
    moe_tokenizer_free(t);
}

int main(void) {
    test_roundtrips();
    test_layout_and_damage();
    test_sets();
    return test_summary("test_shard");
}
