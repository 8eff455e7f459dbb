/* test_safetensors: round trip of the writer through the strict reader (sorting, alignment,
 * metadata, dtype conversion), and the reader's refusal of every malformed header we know
 * of, each with a message naming the file and the tensor. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe/fileio.h"
#include "moe/safetensors.h"
#include "testlib.h"

/* A file image: 8-byte length, header text, `data_bytes` bytes of 0xAB. */
static uint8_t *image(const char *header, size_t data_bytes, size_t *n) {
    size_t h = strlen(header);
    *n = 8 + h + data_bytes;
    uint8_t *b = malloc(*n);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, header, h);
    memset(b + 8 + h, 0xAB, data_bytes);
    return b;
}

/* Parses header+data and expects MOE_ERR_INPUT whose message contains each of the needles. */
static void expect_bad(const char *header, size_t data_bytes, const char *needle1,
                       const char *needle2) {
    size_t n;
    uint8_t *b = image(header, data_bytes, &n);
    moe_st_file f;
    moe_err err;
    moe_err_clear(&err);
    moe_status st = moe_st_open_memory(&f, b, n, "bad.safetensors", &err);
    CHECK_MSG(st == MOE_ERR_INPUT, "header %s: expected an input error, got %d", header, st);
    CHECK_MSG(strcmp(err.file, "bad.safetensors") == 0, "error names file '%s'", err.file);
    CHECK_MSG(!needle1 || strstr(err.msg, needle1), "'%s' not in '%s'", needle1, err.msg);
    CHECK_MSG(!needle2 || strstr(err.msg, needle2), "'%s' not in '%s'", needle2, err.msg);
    if (st == MOE_OK) moe_st_close(&f);
    free(b);
}

static void test_round_trip(void) {
    moe_err err;
    moe_err_clear(&err);
    float a[6] = {1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, 65504.0f};
    int32_t ids[3] = {7, -1, 1 << 30};
    uint8_t bytes[5] = {1, 2, 3, 4, 5};
    int64_t sa[2] = {2, 3}, si[1] = {3}, sb[1] = {5}, sc[0] = {};
    double scalar = 0.5;
    moe_st_writer w;
    moe_st_writer_init(&w);
    CHECK(moe_st_writer_add(&w, "z.weight", MOE_ST_F32, 2, sa, a, &err) == MOE_OK);
    CHECK(moe_st_writer_add(&w, "ids", MOE_ST_I32, 1, si, ids, &err) == MOE_OK);
    CHECK(moe_st_writer_add(&w, "b", MOE_ST_U8, 1, sb, bytes, &err) == MOE_OK);
    CHECK(moe_st_writer_add(&w, "s", MOE_ST_F64, 0, sc, &scalar, &err) == MOE_OK);
    CHECK(moe_st_writer_add_f32(&w, "a.bf16", MOE_ST_BF16, 2, sa, a, &err) == MOE_OK);
    CHECK(moe_st_writer_add_f32(&w, "a.f16", MOE_ST_F16, 2, sa, a, &err) == MOE_OK);
    CHECK(moe_st_writer_add_f32(&w, "bad", MOE_ST_I32, 2, sa, a, &err) == MOE_ERR_RUNTIME);
    moe_err_clear(&err);
    CHECK(moe_st_writer_meta(&w, "format", "pt", &err) == MOE_OK);
    CHECK(moe_st_writer_write(&w, "rt.safetensors", &err) == MOE_OK);
    moe_st_writer_free(&w);

    char *raw;
    size_t n;
    CHECK(moe_read_file("rt.safetensors", &raw, &n, &err) == MOE_OK);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | (uint8_t)raw[i];
    CHECK_INT_EQ((8 + hlen) % 8, 0);
    CHECK(raw[8 + hlen - 1] == '}' || raw[8 + hlen - 1] == ' ');
    /* Names sorted in the header: "a.bf16" before "b" before "z.weight". */
    char *pa = strstr(raw + 8, "\"a.bf16\""), *pb = strstr(raw + 8, "\"b\""),
         *pz = strstr(raw + 8, "\"z.weight\"");
    CHECK(pa && pb && pz && pa < pb && pb < pz);
    free(raw);

    moe_st_file f;
    moe_err_clear(&err);
    if (moe_st_open(&f, "rt.safetensors", &err) != MOE_OK) {
        CHECK_MSG(0, "open: %s", err.msg);
        return;
    }
    CHECK_INT_EQ(f.n_tensors, 6);
    CHECK(moe_st_meta(&f, "format") && strcmp(moe_st_meta(&f, "format"), "pt") == 0);
    CHECK(moe_st_meta(&f, "missing") == NULL);
    for (int i = 1; i < f.n_tensors; i++)
        CHECK(strcmp(f.tensors[i - 1].name, f.tensors[i].name) < 0);
    /* Payloads are packed back to back in name order, starting at offset 0. */
    CHECK_INT_EQ(f.tensors[0].begin, 0);
    for (int i = 1; i < f.n_tensors; i++)
        CHECK_INT_EQ(f.tensors[i].begin, f.tensors[i - 1].end);
    const moe_st_tensor *t;
    CHECK(moe_st_expect(&f, "z.weight", 2, sa, &t, &err) == MOE_OK);
    if (t) {
        CHECK(t->dtype == MOE_ST_F32);
        CHECK(memcmp(t->data, a, sizeof a) == 0);
    }
    float back[6];
    t = moe_st_find(&f, "a.bf16");
    CHECK(t && t->dtype == MOE_ST_BF16 && t->numel == 6);
    if (t) {
        CHECK(moe_st_read_f32(&f, t, back, &err) == MOE_OK);
        for (int i = 0; i < 6; i++)
            CHECK_NEAR(back[i], a[i], fabsf(a[i]) / 256 + 1e-30);
        CHECK(back[0] == 1.0f && back[1] == -2.5f); /* exactly representable */
    }
    t = moe_st_find(&f, "a.f16");
    if (t) {
        CHECK(moe_st_read_f32(&f, t, back, &err) == MOE_OK);
        for (int i = 0; i < 6; i++)
            CHECK_NEAR(back[i], a[i], fabsf(a[i]) / 2048 + 1e-7);
        CHECK(back[5] == 65504.0f);
    }
    t = moe_st_find(&f, "ids");
    if (t) {
        CHECK(moe_st_read_f32(&f, t, back, &err) == MOE_OK);
        CHECK(back[0] == 7.0f && back[1] == -1.0f && back[2] == 1073741824.0f);
    }
    t = moe_st_find(&f, "s");
    CHECK(t && t->ndim == 0 && t->numel == 1);
    if (t) {
        CHECK(moe_st_read_f32(&f, t, back, &err) == MOE_OK);
        CHECK(back[0] == 0.5f);
    }
    /* Shape mismatch and missing tensor name the tensor and the file. */
    int64_t wrong[2] = {3, 2};
    moe_err_clear(&err);
    CHECK(moe_st_expect(&f, "z.weight", 2, wrong, &t, &err) == MOE_ERR_INPUT);
    CHECK(strstr(err.msg, "z.weight") && strstr(err.msg, "[2, 3]") && strstr(err.msg, "[3, 2]"));
    CHECK(strcmp(err.file, "rt.safetensors") == 0);
    moe_err_clear(&err);
    CHECK(moe_st_expect(&f, "nope", 1, si, &t, &err) == MOE_ERR_INPUT);
    CHECK(strstr(err.msg, "nope") != NULL);
    moe_st_close(&f);

    /* A name added twice is refused and leaves no file behind. */
    moe_st_writer_init(&w);
    moe_err_clear(&err);
    CHECK(moe_st_writer_add(&w, "x", MOE_ST_F32, 2, sa, a, &err) == MOE_OK);
    CHECK(moe_st_writer_add(&w, "x", MOE_ST_F32, 2, sa, a, &err) == MOE_OK);
    CHECK(moe_st_writer_write(&w, "dup.safetensors", &err) == MOE_ERR_RUNTIME);
    CHECK(strstr(err.msg, "'x'") != NULL);
    CHECK(access("dup.safetensors", F_OK) != 0);
    moe_st_writer_free(&w);
}

static void test_half_rounding(void) {
    /* 1 + 2^-8 is exactly halfway between two bf16 values: ties to even -> 1.0;
     * 1 + 3*2^-8 ties up to 1 + 2^-6. Overflow to inf in f16 at 65520. */
    float v[4] = {1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 65520.0f, 6e-8f};
    int64_t s[1] = {4};
    moe_err err;
    moe_err_clear(&err);
    moe_st_writer w;
    moe_st_writer_init(&w);
    moe_st_writer_add_f32(&w, "b", MOE_ST_BF16, 1, s, v, &err);
    moe_st_writer_add_f32(&w, "h", MOE_ST_F16, 1, s, v, &err);
    CHECK(moe_st_writer_write(&w, "half.safetensors", &err) == MOE_OK);
    moe_st_writer_free(&w);
    moe_st_file f;
    if (moe_st_open(&f, "half.safetensors", &err) != MOE_OK) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    float out[4];
    moe_st_read_f32(&f, moe_st_find(&f, "b"), out, &err);
    CHECK(out[0] == 1.0f);
    CHECK(out[1] == 1.0f + 4.0f / 256);
    moe_st_read_f32(&f, moe_st_find(&f, "h"), out, &err);
    CHECK(isinf(out[2]) && out[2] > 0);
    CHECK(out[3] == ldexpf(1.0f, -24)); /* 6e-8 rounds to the smallest f16 subnormal */
    moe_st_close(&f);
}

static void test_strict(void) {
    /* Truncated: shorter than the length prefix; length larger than the file; > 100 MB. */
    moe_st_file f;
    moe_err err;
    moe_err_clear(&err);
    CHECK(moe_st_open_memory(&f, "\x10\0\0", 3, "t.safetensors", &err) == MOE_ERR_INPUT);
    CHECK(strstr(err.msg, "8-byte") != NULL);
    uint8_t big[16] = {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, '{', '}'};
    moe_err_clear(&err);
    CHECK(moe_st_open_memory(&f, big, 10, "t.safetensors", &err) == MOE_ERR_INPUT);
    CHECK(strstr(err.msg, "100 MB") != NULL);
    uint8_t longer[10] = {40, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    moe_err_clear(&err);
    CHECK(moe_st_open_memory(&f, longer, 10, "t.safetensors", &err) == MOE_ERR_INPUT);
    CHECK(strstr(err.msg, "rest of the file") != NULL);

    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], ", 0, "not valid JSON", NULL);
    expect_bad("[1, 2]", 0, "not a JSON object", NULL);
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
               8, "not valid JSON", NULL); /* duplicate key */
    expect_bad("{\"w\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "'w'",
               "unknown dtype");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "'w'",
               "non-negative");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 24, "'w'",
               "need 24");
    expect_bad("{\"w\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16, "'w'",
               "BF16");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", 16, "'w'",
               "past the data area");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4]}}", 16, "'w'",
               "data_offsets");
    expect_bad("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 16, "'w'", "dtype");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 16, "'w'", "shape");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
               16, "overlap", "'a'");
    expect_bad("{\"__metadata__\":{\"format\":1}}", 0, "__metadata__", "format");
    expect_bad("{\"__metadata__\":[]}", 0, "__metadata__", NULL);
    expect_bad("{\"w\":[0,4]}", 4, "'w'", "not a JSON object");

    /* Valid edge cases: empty header object, zero-sized tensors sharing an offset, padding. */
    size_t n;
    uint8_t *b = image("{}      ", 0, &n);
    moe_err_clear(&err);
    CHECK(moe_st_open_memory(&f, b, n, "ok.safetensors", &err) == MOE_OK);
    if (err.status == MOE_OK) moe_st_close(&f);
    free(b);
    b = image("{\"e\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[0,0]},"
              "\"f\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]},"
              "\"g\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}",
              8, &n);
    moe_err_clear(&err);
    CHECK_MSG(moe_st_open_memory(&f, b, n, "ok.safetensors", &err) == MOE_OK, "%s", err.msg);
    if (err.status == MOE_OK) {
        CHECK_INT_EQ(f.n_tensors, 3);
        moe_st_close(&f);
    }
    free(b);

    /* A real file cut short: its tensors now end past the data area. */
    moe_st_writer w;
    moe_st_writer_init(&w);
    float x[64] = {0};
    int64_t s[1] = {64};
    moe_st_writer_add(&w, "model.norm.weight", MOE_ST_F32, 1, s, x, &err);
    CHECK(moe_st_writer_write(&w, "cut.safetensors", &err) == MOE_OK);
    moe_st_writer_free(&w);
    CHECK(truncate("cut.safetensors", 8 + 128) == 0);
    moe_err_clear(&err);
    CHECK(moe_st_open(&f, "cut.safetensors", &err) == MOE_ERR_INPUT);
    CHECK(strstr(err.msg, "model.norm.weight") && strcmp(err.file, "cut.safetensors") == 0);
    moe_err_clear(&err);
    CHECK(moe_st_open(&f, "does-not-exist.safetensors", &err) == MOE_ERR_INPUT);
    CHECK(strcmp(err.file, "does-not-exist.safetensors") == 0);
}

/* Random damage to a valid file (header bytes, length prefix, truncation) must give MOE_OK or
 * an input error naming the file - never a crash or an out-of-bounds read (run under ASan). */
static void test_mutations(void) {
    float x[12] = {0};
    int64_t s2[2] = {3, 4}, s1[1] = {2};
    moe_err err;
    moe_err_clear(&err);
    moe_st_writer w;
    moe_st_writer_init(&w);
    moe_st_writer_add(&w, "a.weight", MOE_ST_F32, 2, s2, x, &err);
    moe_st_writer_add_f32(&w, "b.weight", MOE_ST_BF16, 1, s1, x, &err);
    moe_st_writer_meta(&w, "format", "pt", &err);
    CHECK(moe_st_writer_write(&w, "mut.safetensors", &err) == MOE_OK);
    moe_st_writer_free(&w);
    char *raw;
    size_t n;
    if (moe_read_file("mut.safetensors", &raw, &n, &err) != MOE_OK) return;
    uint8_t *buf = malloc(n);
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    int bad_status = 0, ok = 0, refused = 0;
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(buf, raw, n);
        size_t len = n;
        int flips = 1 + iter % 4;
        for (int k = 0; k < flips; k++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            size_t pos = (size_t)(rng >> 33) % (iter % 3 == 0 ? 8 + 16 : n); /* often the prefix */
            buf[pos] = (uint8_t)(rng >> 20);
        }
        if (iter % 7 == 0) len = (size_t)(rng >> 40) % n;
        moe_st_file f;
        moe_err_clear(&err);
        moe_status st = moe_st_open_memory(&f, buf, len, "mut.safetensors", &err);
        if (st == MOE_OK) {
            ok++;
            float out[12];
            for (int i = 0; i < f.n_tensors; i++)
                if (f.tensors[i].numel <= 12) moe_st_read_f32(&f, &f.tensors[i], out, &err);
            moe_st_close(&f);
        } else if (st == MOE_ERR_INPUT && strcmp(err.file, "mut.safetensors") == 0) {
            refused++;
        } else {
            bad_status++;
        }
    }
    CHECK_INT_EQ(bad_status, 0);
    CHECK(refused > 1000 && ok > 0);
    free(buf);
    free(raw);
}

int main(void) {
    test_round_trip();
    test_mutations();
    test_half_rounding();
    test_strict();
    return test_summary("safetensors");
}
