/* test_tokenizer: the byte, nuc and kmer tokenizers - vocabularies, special ids, every
 * policy, encode/decode round trips, spec JSON round trips and rejection of bad specs.
 *
 * Expected ids are derived from the documented layouts (docs/formats.md), not copied from
 * the implementation's output. */
#include <stdlib.h>
#include <string.h>

#include "moe/tokenizer.h"
#include "testlib.h"

static moe_tokenizer *make(moe_tokenizer_kind kind, void (*tweak)(moe_tokenizer_opts *)) {
    moe_tokenizer_opts o;
    moe_tokenizer_opts_defaults(&o, kind);
    if (tweak) tweak(&o);
    moe_tokenizer *t = NULL;
    moe_err err;
    moe_err_clear(&err);
    CHECK_MSG(moe_tokenizer_create(&t, &o, &err) == MOE_OK, "create: %s", err.msg);
    return t;
}

/* Encodes s and returns the number of tokens (ids in b). */
static int64_t enc(const moe_tokenizer *t, const char *s, moe_token_buf *b) {
    moe_err err;
    moe_err_clear(&err);
    b->n = 0;
    CHECK_MSG(moe_tokenizer_encode(t, s, (int64_t)strlen(s), b, &err) == MOE_OK, "encode %s: %s", s,
              err.msg);
    return b->n;
}

static void check_roundtrip(const moe_tokenizer *t, const char *in, const char *want) {
    moe_token_buf b = {0};
    int64_t n = enc(t, in, &b);
    char *out = malloc((size_t)n * (size_t)moe_tokenizer_max_bases_per_token(t) + 1);
    int64_t m = moe_tokenizer_decode(t, b.ids, b.lower, n, out);
    out[m] = '\0';
    CHECK_MSG(strcmp(out, want) == 0, "%s: decode(encode(%s)) = %s, want %s", t->name, in, out,
              want);
    free(out);
    moe_token_buf_free(&b);
}

static void check_spec_roundtrip(const moe_tokenizer *t) {
    moe_tokenizer *u = NULL;
    moe_err err;
    moe_err_clear(&err);
    CHECK_MSG(moe_tokenizer_from_json(&u, moe_tokenizer_spec_json(t), "test", &err) == MOE_OK,
              "from_json: %s", err.msg);
    if (!u) return;
    CHECK(u->vocab_hash == t->vocab_hash);
    CHECK_INT_EQ(u->vocab_size, t->vocab_size);
    CHECK(strcmp(moe_tokenizer_spec_json(u), moe_tokenizer_spec_json(t)) == 0);
    CHECK_INT_EQ(u->eos_id, t->eos_id);
    CHECK_INT_EQ(u->bos_id, t->bos_id);
    CHECK_INT_EQ(u->pad_id, t->pad_id);
    moe_tokenizer_free(u);
}

static void case_upper(moe_tokenizer_opts *o) {
    o->case_policy = MOE_CASE_UPPER;
}
static void case_mask(moe_tokenizer_opts *o) {
    o->case_policy = MOE_CASE_UPPER_MASK;
}
static void iupac_ton(moe_tokenizer_opts *o) {
    o->iupac = MOE_IUPAC_TO_N;
}
static void iupac_drop_collapse(moe_tokenizer_opts *o) {
    o->iupac = MOE_IUPAC_DROP;
    o->nrun = MOE_NRUN_COLLAPSE;
}
static void byte512(moe_tokenizer_opts *o) {
    o->vocab_size = 512;
}
static void nuc_compact(moe_tokenizer_opts *o) {
    o->case_policy = MOE_CASE_UPPER;
    o->iupac = MOE_IUPAC_TO_N;
}
static void kmer2(moe_tokenizer_opts *o) {
    o->k = 2;
}
static void kmer3_mask(moe_tokenizer_opts *o) {
    o->k = 3;
    o->case_policy = MOE_CASE_UPPER_MASK;
}
static void kmer8(moe_tokenizer_opts *o) {
    o->k = 8;
}
static void bos_eos(moe_tokenizer_opts *o) {
    o->add_bos = 1;
    o->add_eos = 1;
}

static void test_byte(void) {
    moe_tokenizer *t = make(MOE_TOKENIZER_BYTE, NULL);
    if (!t) return;
    CHECK_INT_EQ(t->vocab_size, 256);
    CHECK_INT_EQ(t->eos_id, 0); /* Evo 2 / BioNeMo layout */
    CHECK_INT_EQ(t->pad_id, 1);
    CHECK_INT_EQ(t->bos_id, 2);
    CHECK_INT_EQ(t->sep_id, 3);
    CHECK_INT_EQ(t->unk_id, 4);
    CHECK_INT_EQ(t->mask_id, -1);
    moe_token_buf b = {0};
    const char *s = "ACGTNacgtnRYu";
    CHECK_INT_EQ(enc(t, s, &b), (int64_t)strlen(s));
    for (size_t i = 0; i < strlen(s); i++)
        CHECK_INT_EQ(b.ids[i], (unsigned char)s[i]);
    check_roundtrip(t, s, s);
    check_spec_roundtrip(t);
    /* not a nucleotide: error names character and 1-based position */
    moe_err err;
    moe_err_clear(&err);
    b.n = 0;
    CHECK(moe_tokenizer_encode(t, "ACG-T", 5, &b, &err) == MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.msg, "'-'") && strstr(err.msg, "base 4"), "message: %s", err.msg);
    moe_err_clear(&err);
    b.n = 0;
    CHECK(moe_tokenizer_encode(t, "AC\001", 3, &b, &err) == MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.msg, "0x01") != NULL, "message: %s", err.msg);
    moe_token_buf_free(&b);
    moe_tokenizer_free(t);

    t = make(MOE_TOKENIZER_BYTE, byte512);
    if (t) {
        CHECK_INT_EQ(t->vocab_size, 512);
        check_spec_roundtrip(t);
        moe_tokenizer_free(t);
    }
    t = make(MOE_TOKENIZER_BYTE, case_upper);
    if (t) {
        check_roundtrip(t, "acgtNnRy", "ACGTNNRY");
        moe_tokenizer_free(t);
    }
    t = make(MOE_TOKENIZER_BYTE, iupac_ton);
    if (t) {
        check_roundtrip(t, "ACRYUu", "ACNNTt"); /* U is T, case kept */
        moe_tokenizer_free(t);
    }
    t = make(MOE_TOKENIZER_BYTE, iupac_drop_collapse);
    if (t) {
        check_roundtrip(t, "ANNNRNyAnnA", "ANAnA"); /* R and y removed, N runs collapsed */
        moe_tokenizer_free(t);
    }
}

static void test_byte_mask_and_doc(void) {
    moe_tokenizer *t = make(MOE_TOKENIZER_BYTE, case_mask);
    if (!t) return;
    moe_token_buf b = {0};
    CHECK_INT_EQ(enc(t, "AcGt", &b), 4);
    CHECK_INT_EQ(b.ids[1], 'C');
    CHECK_INT_EQ(b.ids[3], 'T');
    CHECK(b.lower[0] == 0 && b.lower[1] == 1 && b.lower[2] == 0 && b.lower[3] == 1);
    check_roundtrip(t, "AcGtnN", "AcGtnN"); /* the mask restores the case exactly */
    moe_token_buf_free(&b);
    moe_tokenizer_free(t);

    t = make(MOE_TOKENIZER_BYTE, bos_eos);
    if (!t) return;
    moe_err err;
    moe_err_clear(&err);
    b.want_pos = 1;
    CHECK(moe_tokenizer_encode_doc(t, "ACG", 3, &b, &err) == MOE_OK);
    CHECK_INT_EQ(b.n, 5);
    CHECK_INT_EQ(b.ids[0], t->bos_id);
    CHECK_INT_EQ(b.ids[4], t->eos_id);
    CHECK_INT_EQ(b.pos[0], -1);
    CHECK_INT_EQ(b.pos[2], 1);
    CHECK(moe_tokenizer_is_special(t, b.ids[0]) && !moe_tokenizer_is_special(t, b.ids[1]));
    moe_token_buf_free(&b);
    moe_tokenizer_free(t);
}

static void test_nuc(void) {
    moe_tokenizer *t = make(MOE_TOKENIZER_NUC, NULL);
    if (!t) return;
    /* 5 specials + (ACGTN + 11 IUPAC) x 2 cases = 37, padded to 40 */
    CHECK_INT_EQ(t->vocab_size, 40);
    CHECK_INT_EQ(t->pad_id, 0);
    CHECK_INT_EQ(t->mask_id, 3);
    CHECK(strcmp(moe_tokenizer_token_str(t, 5), "A") == 0);
    CHECK(strcmp(moe_tokenizer_token_str(t, 9), "N") == 0);
    check_roundtrip(t, "ACGTNacgtnRYSWKMBDHVUryswkmbdhvu", "ACGTNacgtnRYSWKMBDHVUryswkmbdhvu");
    check_spec_roundtrip(t);
    moe_tokenizer_free(t);

    t = make(MOE_TOKENIZER_NUC, nuc_compact);
    if (!t) return;
    CHECK_INT_EQ(t->vocab_size, 16); /* 5 + ACGTN = 10, padded to 16 */
    moe_token_buf b = {0};
    CHECK_INT_EQ(enc(t, "AcGtNr", &b), 6);
    int32_t want[6] = {5, 6, 7, 8, 9, 9};
    for (int i = 0; i < 6; i++)
        CHECK_INT_EQ(b.ids[i], want[i]);
    CHECK(moe_tokenizer_is_n(t, 9) && !moe_tokenizer_is_n(t, 5));
    moe_token_buf_free(&b);
    check_spec_roundtrip(t);
    moe_tokenizer_free(t);
}

static void test_kmer(void) {
    moe_tokenizer *t = make(MOE_TOKENIZER_KMER, kmer2);
    if (!t) return;
    CHECK_INT_EQ(t->vocab_size, 32); /* 5 + 16 + 5 = 26 -> 32 */
    moe_token_buf b = {0};
    b.want_pos = 1;
    /* AC GT | A single | N | CC | T single */
    CHECK_INT_EQ(enc(t, "ACGTANCCT", &b), 6);
    int32_t want[6] = {5 + 1, 5 + 11, 21 + 0, 21 + 4, 5 + 5, 21 + 3};
    int64_t want_pos[6] = {0, 2, 4, 5, 6, 8};
    for (int i = 0; i < 6; i++) {
        CHECK_INT_EQ(b.ids[i], want[i]);
        CHECK_INT_EQ(b.pos[i], want_pos[i]);
    }
    CHECK(strcmp(moe_tokenizer_token_str(t, 16), "GT") == 0);
    check_roundtrip(t, "ACGTANCCTrAC", "ACGTANCCTNAC"); /* r -> N (to-n), upper case */
    check_spec_roundtrip(t);
    moe_token_buf_free(&b);
    moe_tokenizer_free(t);

    t = make(MOE_TOKENIZER_KMER, kmer3_mask);
    if (t) {
        /* a k-mer is lower case when any base is; singles keep their own case */
        check_roundtrip(t, "ACgTTTa", "acgTTTa");
        moe_tokenizer_free(t);
    }
    t = make(MOE_TOKENIZER_KMER, NULL);
    if (t) {
        CHECK_INT_EQ(t->opts.k, 6);
        CHECK_INT_EQ(t->vocab_size, 4112); /* 5 + 4096 + 5 = 4106 -> 4112 */
        moe_tokenizer_free(t);
    }
    t = make(MOE_TOKENIZER_KMER, kmer8);
    if (t) {
        CHECK_INT_EQ(t->vocab_size, 65552);
        check_roundtrip(t, "ACGTACGTTTGCA", "ACGTACGTTTGCA");
        moe_tokenizer_free(t);
    }
}

static void test_bad_options_and_specs(void) {
    moe_tokenizer_opts o;
    moe_tokenizer *t = NULL;
    moe_err err;
    moe_tokenizer_opts_defaults(&o, MOE_TOKENIZER_KMER);
    o.case_policy = MOE_CASE_KEEP;
    moe_err_clear(&err);
    CHECK(moe_tokenizer_create(&t, &o, &err) == MOE_ERR_INPUT && !t);
    moe_tokenizer_opts_defaults(&o, MOE_TOKENIZER_KMER);
    o.k = 9;
    moe_err_clear(&err);
    CHECK(moe_tokenizer_create(&t, &o, &err) == MOE_ERR_INPUT);
    moe_tokenizer_opts_defaults(&o, MOE_TOKENIZER_BYTE);
    o.vocab_size = 300;
    moe_err_clear(&err);
    CHECK(moe_tokenizer_create(&t, &o, &err) == MOE_ERR_INPUT);

    t = make(MOE_TOKENIZER_NUC, NULL);
    if (!t) return;
    const char *spec = moe_tokenizer_spec_json(t);
    char *bad = malloc(strlen(spec) + 64);
    /* a different vocabulary hash must be refused */
    strcpy(bad, spec);
    char *h = strstr(bad, "\"vocab_hash\":\"");
    if (h) h[14] = h[14] == '0' ? '1' : '0';
    moe_tokenizer *u = NULL;
    moe_err_clear(&err);
    CHECK(moe_tokenizer_from_json(&u, bad, "spec", &err) == MOE_ERR_INPUT && !u);
    CHECK_MSG(strstr(err.msg, "vocabulary") != NULL, "message: %s", err.msg);
    moe_err_clear(&err);
    CHECK(moe_tokenizer_from_json(&u, "{\"format\":\"moe-tokenizer\",\"name\":\"bpe\"}", "s",
                                  &err) == MOE_ERR_INPUT);
    moe_err_clear(&err);
    CHECK(moe_tokenizer_from_json(&u, "{not json", "s", &err) == MOE_ERR_INPUT);
    CHECK(strcmp(err.file, "s") == 0);
    free(bad);
    moe_tokenizer_free(t);

    CHECK_INT_EQ(moe_case_policy_parse("upper+mask"), MOE_CASE_UPPER_MASK);
    CHECK_INT_EQ(moe_nrun_policy_parse("split"), MOE_NRUN_SPLIT);
    CHECK_INT_EQ(moe_revcomp_policy_parse("sideways"), -1);
    CHECK(strcmp(moe_iupac_policy_name(MOE_IUPAC_TO_N), "to-n") == 0);
}

int main(void) {
    test_byte();
    test_byte_mask_and_doc();
    test_nuc();
    test_kmer();
    test_bad_options_and_specs();
    return test_summary("test_tokenizer");
}
