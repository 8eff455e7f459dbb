/* test_config: the YAML configuration module (moe/config.h) and its schema table.
 *
 * Covers: every default parses and validates; the schema rows map onto disjoint struct
 * fields; every config in configs/ loads; dump -> load is bit-identical; each error kind
 * reports the exact line:col and a useful hint; overrides; cross-field rules; and
 * docs/config.md is what moe_config_write_markdown() generates. Run the binary with
 * MOE_REGEN_DOCS=1 (and MOE_SRC_DIR set) to rewrite docs/config.md after a schema change. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "io/config_schema.h"
#include "moe/config.h"
#include "moe/fileio.h"
#include "testlib.h"

static int contains(const char *hay, const char *needle) {
    return strstr(hay, needle) != NULL;
}

/* Loads yaml (must fail) and checks line:col and substrings of the message and the hint. */
static void expect_err_at(int src_line, const char *yaml, int64_t line, int64_t col,
                          const char *msg_part, const char *hint_part) {
    moe_config c;
    moe_err err = {0};
    moe_status st = moe_config_load_string(&c, yaml, "t.yaml", &err);
    if (st != MOE_ERR_INPUT) {
        test_fail(__FILE__, src_line, "expected MOE_ERR_INPUT for:\n%s", yaml);
        return;
    }
    test_checks++;
    if (err.line != line || err.col != col || strcmp(err.file, "t.yaml") != 0)
        test_fail(__FILE__, src_line, "location %s:%lld:%lld, expected t.yaml:%lld:%lld (%s)",
                  err.file, (long long)err.line, (long long)err.col, (long long)line,
                  (long long)col, err.msg);
    test_checks++;
    if (msg_part && !contains(err.msg, msg_part))
        test_fail(__FILE__, src_line, "message '%s' lacks '%s'", err.msg, msg_part);
    test_checks++;
    if (hint_part && !contains(err.hint, hint_part))
        test_fail(__FILE__, src_line, "hint '%s' lacks '%s'", err.hint, hint_part);
}
#define EXPECT_ERR(yaml, line, col, msg, hint) expect_err_at(__LINE__, yaml, line, col, msg, hint)

/* Loads defaults + overrides (must fail) and checks message and hint substrings. */
static void expect_override_err_at(int src_line, const char *ov, const char *msg_part,
                                   const char *hint_part) {
    moe_config c;
    moe_err err = {0};
    char *ovs[1] = {(char *)ov};
    if (moe_config_load(&c, NULL, 1, ovs, &err) != MOE_ERR_INPUT) {
        test_fail(__FILE__, src_line, "override '%s' was accepted", ov);
        return;
    }
    test_checks++;
    if (!contains(err.msg, msg_part))
        test_fail(__FILE__, src_line, "message '%s' lacks '%s'", err.msg, msg_part);
    test_checks++;
    if (hint_part && !contains(err.hint, hint_part))
        test_fail(__FILE__, src_line, "hint '%s' lacks '%s'", err.hint, hint_part);
}
#define EXPECT_OVERRIDE_ERR(ov, msg, hint) expect_override_err_at(__LINE__, ov, msg, hint)

/* Cross-field rule on a default config with overrides applied by moe_config_set. */
static void expect_invalid_at(int src_line, const char *const *sets, const char *msg_part) {
    moe_config c;
    moe_err err = {0};
    moe_config_defaults(&c);
    for (int i = 0; sets[i]; i += 2) {
        moe_err e2 = {0};
        if (moe_config_set(&c, sets[i], sets[i + 1], &e2) != MOE_OK)
            test_fail(__FILE__, src_line, "set %s=%s: %s", sets[i], sets[i + 1], e2.msg);
    }
    test_checks++;
    if (moe_config_validate(&c, &err) != MOE_ERR_INPUT) {
        test_fail(__FILE__, src_line, "validation passed, expected '%s'", msg_part);
        return;
    }
    test_checks++;
    if (!contains(err.msg, msg_part) || !err.hint[0])
        test_fail(__FILE__, src_line, "message '%s' (hint '%s') lacks '%s'", err.msg, err.hint,
                  msg_part);
}
#define EXPECT_INVALID(msg, ...)                                                                   \
    do {                                                                                           \
        const char *sets_[] = {__VA_ARGS__, NULL};                                                 \
        expect_invalid_at(__LINE__, sets_, msg);                                                   \
    } while (0)

static void test_schema_table(void) {
    char why[256];
    for (int i = 0; i < moe_cfg_n_keys; i++) {
        const moe_cfg_key *k = &moe_cfg_keys[i];
        size_t want = k->type == MOE_CFG_INT     ? sizeof(int64_t)
                      : k->type == MOE_CFG_FLOAT ? sizeof(double)
                      : k->type == MOE_CFG_BOOL  ? sizeof(bool)
                      : k->type == MOE_CFG_ENUM  ? sizeof(int)
                                                 : k->size;
        CHECK_MSG(k->size == want && k->offset + k->size <= sizeof(moe_config),
                  "%s: size %zu, expected %zu", k->key, k->size, want);
        CHECK_MSG(k->doc && k->doc[0] && k->def, "%s has no doc or default", k->key);
        CHECK_MSG(moe_cfg_find(k->key) == k, "%s is not unique", k->key);
        int in_section = 0;
        for (int s = 0; s < moe_cfg_n_sections; s++)
            in_section += moe_cfg_in_section(k, moe_cfg_sections[s].name);
        CHECK_MSG(in_section == 1, "%s belongs to %d sections", k->key, in_section);
        for (int j = 0; j < i; j++) { /* fields never overlap */
            const moe_cfg_key *o = &moe_cfg_keys[j];
            CHECK_MSG(k->offset >= o->offset + o->size || o->offset >= k->offset + k->size,
                      "%s overlaps %s", k->key, o->key);
        }
        /* the default text parses and is in range */
        moe_config c;
        memset(&c, 0, sizeof c);
        const char *d = k->def;
        size_t len = strlen(d);
        if (k->type == MOE_CFG_STRING) d++, len -= 2;
        CHECK_MSG(moe_cfg_parse_value(k, &c, d, len, why, sizeof why) == 0, "%s default: %s",
                  k->key, why);
        CHECK_MSG(moe_cfg_check_range(k, &c, why, sizeof why) == 0, "%s default: %s", k->key, why);
    }
    /* Every field of the struct has a row: what no row covers is alignment padding, i.e.
     * gaps shorter than 8 bytes that end at an 8-byte boundary or at a 4-byte field. */
    unsigned char mark[sizeof(moe_config)];
    memset(mark, 0, sizeof mark);
    for (int i = 0; i < moe_cfg_n_keys; i++)
        memset(mark + moe_cfg_keys[i].offset, 1, moe_cfg_keys[i].size);
    size_t gap_bytes = 0;
    for (size_t i = 0; i < sizeof mark;) {
        size_t j = i;
        while (j < sizeof mark && !mark[j])
            j++;
        if (j > i) {
            CHECK_MSG(j - i < 8 && (j % 4 == 0), "bytes %zu..%zu of moe_config have no row", i, j);
            gap_bytes += j - i;
        }
        i = j + 1;
    }
    CHECK_MSG(gap_bytes <= 48, "%zu bytes of moe_config not in the schema", gap_bytes);
}

static void test_defaults(void) {
    moe_config a, b;
    moe_err err = {0};
    memset(&a, 0x5a, sizeof a);
    memset(&b, 0xa5, sizeof b);
    moe_config_defaults(&a);
    moe_config_defaults(&b);
    CHECK(memcmp(&a, &b, sizeof a) == 0);
    CHECK_INT_EQ(moe_config_validate(&a, &err), MOE_OK);
    CHECK_INT_EQ(a.model.vocab_size, 256);
    CHECK_INT_EQ(a.train.micro_batch_tokens, 0);
    CHECK_NEAR(a.model.router_z_loss_coef, 0.001, 0);
    CHECK_NEAR(a.model.router_aux_loss_coef, 0.02, 0);
    CHECK_NEAR(a.data.lowercase_weight, 1.0, 0);
    CHECK(a.train.document_mask); /* packed documents kept apart unless asked otherwise */
    CHECK_INT_EQ(a.device, MOE_DEVICE_AUTO);
    CHECK_INT_EQ(a.precision.recipe, MOE_RECIPE_FP32);
    CHECK(a.data.path[0] == '\0' && a.log.json[0] == '\0');
    /* empty files and empty sections keep the defaults */
    CHECK_INT_EQ(moe_config_load_string(&b, "", "empty.yaml", &err), MOE_OK);
    CHECK(memcmp(&a, &b, sizeof a) == 0);
    CHECK_INT_EQ(moe_config_load_string(&b, "# nothing\ntrain:\nmodel: ~\n", "e.yaml", &err),
                 MOE_OK);
    CHECK(memcmp(&a, &b, sizeof a) == 0);
    CHECK(strcmp(moe_recipe_name(MOE_RECIPE_FP8_BLOCK), "fp8-block") == 0);
    CHECK(strcmp(moe_recipe_name(MOE_RECIPE_MXFP8), "mxfp8") == 0);
    CHECK(strcmp(moe_device_name(MOE_DEVICE_CUDA), "cuda") == 0);
    CHECK(strcmp(moe_lr_schedule_name(MOE_SCHED_CONSTANT), "constant") == 0);
    CHECK(strcmp(moe_recompute_name(MOE_RECOMPUTE_MOE), "moe") == 0);
}

/* Dumps c, loads the dump, and checks the result is byte-identical (both zero-initialised
 * by moe_config_defaults, so padding compares equal too). */
static void check_round_trip(const moe_config *c, const char *what) {
    char *buf = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&buf, &len);
    moe_err err = {0};
    CHECK(fp != NULL);
    if (!fp) return;
    CHECK_INT_EQ(moe_config_write_yaml(c, fp, &err), MOE_OK);
    fclose(fp);
    moe_config back;
    moe_status st = moe_config_load_string(&back, buf, what, &err);
    CHECK_MSG(st == MOE_OK, "%s: reload failed: %s:%lld:%lld: %s", what, err.file,
              (long long)err.line, (long long)err.col, err.msg);
    CHECK_MSG(memcmp(c, &back, sizeof back) == 0, "%s: round trip differs:\n%s", what, buf);
    CHECK(contains(buf, "# Peak learning rate")); /* doc lines as comments */
    free(buf);
}

static void test_configs_and_round_trip(void) {
    static const char *files[] = {"configs/tiny.yaml", "configs/L0_sanity.yaml",
                                  "configs/og2_8x1b.yaml", "configs/mixtral_8x7b.yaml"};
    moe_config c;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        moe_err err = {0};
        moe_status st = moe_config_load(&c, test_src_path(files[i]), 0, NULL, &err);
        CHECK_MSG(st == MOE_OK, "%s: %s:%lld:%lld: %s", files[i], err.file, (long long)err.line,
                  (long long)err.col, err.msg);
        if (st == MOE_OK) check_round_trip(&c, files[i]);
        if (i == 0) {
            CHECK_INT_EQ(c.model.vocab_size, 256);
            CHECK_INT_EQ(c.device, MOE_DEVICE_CPU);
        } else if (i == 1) {
            CHECK_INT_EQ(c.model.hidden_size, 384);
            CHECK_INT_EQ(c.model.num_key_value_heads, 6);
        } else if (i == 2) {
            CHECK_INT_EQ(c.train.seq_len, 8192);
            CHECK_NEAR(c.model.rope_theta, 500000.0, 0);
            CHECK_INT_EQ(c.train.global_batch_tokens, 16384);
            CHECK_INT_EQ(c.precision.recipe, MOE_RECIPE_BF16);
        } else {
            CHECK_INT_EQ(c.model.intermediate_size, 14336);
            CHECK_NEAR(c.model.rope_theta, 1e6, 0);
            CHECK_INT_EQ(c.parallel.ep, 8);
        }
    }
    moe_config_defaults(&c);
    check_round_trip(&c, "defaults");
    /* awkward values: strings needing escapes, floats without a short decimal form */
    moe_err err = {0};
    snprintf(c.data.path, sizeof c.data.path, "dir with \"quotes\"\\back\tslash\n\x01 # x: y");
    snprintf(c.data.val_path, sizeof c.data.val_path, "GC-r\xc3\xa9gion/'single'.mtok");
    snprintf(c.log.json, sizeof c.log.json, "~");
    c.optim.lr = 0.1 + 0.2;
    c.optim.min_lr = 1.0 / 3.0 * 1e-5;
    c.model.rope_theta = 123456789.123456789;
    c.model.rms_norm_eps = 4.9406564584124654e-300;
    c.data.lowercase_weight = 0.0;
    c.train.seed = INT64_MAX;
    c.train.steps = 9007199254740993LL; /* 2^53 + 1: not exact in a double */
    c.device = MOE_DEVICE_CUDA;
    c.precision.recipe = MOE_RECIPE_MXFP8;
    c.train.recompute = MOE_RECOMPUTE_FULL;
    c.optim.schedule = MOE_SCHED_LINEAR;
    c.model.tie_word_embeddings = true;
    c.data.shuffle = false;
    c.train.document_mask = false;
    CHECK_INT_EQ(moe_config_validate(&c, &err), MOE_OK);
    check_round_trip(&c, "awkward");
    /* shortest round-trip float text over a spread of magnitudes */
    uint64_t s = 88172645463325252ULL;
    for (int i = 0; i < 20000; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        double v;
        memcpy(&v, &s, sizeof v);
        if (!isfinite(v)) continue;
        char txt[64];
        moe_cfg_format_double(v, txt, sizeof txt);
        CHECK_MSG(strtod(txt, NULL) == v, "%s != %.17g", txt, v);
    }
}

static void test_errors(void) {
    /* unknown key: closest key suggested */
    EXPECT_ERR("model:\n  hidden_size: 64\n  num_layers: 4\n", 3, 3,
               "unknown key `model.num_layers`", "did you mean `model.num_hidden_layers`?");
    EXPECT_ERR("train:\n  stpes: 4\n", 2, 3, "unknown key `train.stpes`",
               "did you mean `train.steps`?");
    EXPECT_ERR("model:\n  steps: 4\n", 2, 3, "unknown key `model.steps`",
               "did you mean `train.steps`? `steps` belongs in section train");
    EXPECT_ERR("optim:\n  steps: 4\n", 2, 3, "unknown key `optim.steps`",
               "did you mean `train.steps`?");
    EXPECT_ERR("optim:\n  epss: 4\n", 2, 3, "unknown key", "did you mean `optim.eps`?");
    EXPECT_ERR("train:\n  lr: 4\n", 2, 3, "unknown key", "did you mean `optim.lr`?");
    EXPECT_ERR("trian:\n  steps: 4\n", 1, 1, "unknown key `trian`", "did you mean `train`?");
    EXPECT_ERR("devcie: cpu\n", 1, 1, "unknown key `devcie`", "did you mean `device`?");
    EXPECT_ERR("steps: 3\n", 1, 1, "unknown key `steps`", "did you mean `train.steps`?");
    EXPECT_ERR("device: cpu\ntrain.steps: 3\n", 2, 1, "unknown key `train.steps`",
               "write it nested: `train:` then an indented `steps: ...` line");
    EXPECT_ERR("zzzzzzzz: 3\n", 1, 1, "unknown key", "valid top-level keys: device, model");
    /* wrong type */
    EXPECT_ERR("train:\n  steps: abc\n", 2, 10, "`train.steps`: expected an integer, got 'abc'",
               "steps: 200");
    EXPECT_ERR("train:\n  steps: 1.5\n", 2, 10, "expected an integer", NULL);
    EXPECT_ERR("optim:\n  lr: fast\n", 2, 7, "`optim.lr`: expected a number, got 'fast'", NULL);
    EXPECT_ERR("optim:\n  lr: .nan\n", 2, 7, "expected a number", NULL);
    EXPECT_ERR("optim:\n  lr: 1e999\n", 2, 7, "out of the range of a double", NULL);
    EXPECT_ERR("data:\n  shuffle: maybe\n", 2, 12, "expected true or false, got 'maybe'", NULL);
    EXPECT_ERR("train:\n  document_mask: 2\n", 2, 18, "expected true or false, got '2'", NULL);
    EXPECT_ERR("train:\n  steps: [1, 2]\n", 2, 10, "expected a single value, got a sequence", NULL);
    EXPECT_ERR("train:\n  steps: 99999999999999999999\n", 2, 10, "does not fit in 64 bits", NULL);
    /* out of range, not an allowed value */
    EXPECT_ERR("train:\n  steps: 0\n", 2, 10, "`train.steps`: 0 is out of range: must be >= 1",
               NULL);
    EXPECT_ERR("optim:\n  beta2: 1.0\n", 2, 10, "must be in [0.0, 1.0)", NULL);
    EXPECT_ERR("model:\n  num_hidden_layers: 5000\n", 2, 22, "must be in 1 .. 1024", NULL);
    EXPECT_ERR("precision:\n  recipe: fp16\n", 2, 11,
               "'fp16' is not an allowed value (one of: fp32, bf16, fp8-block, mxfp8)", NULL);
    EXPECT_ERR("device: tpu\n", 1, 9, "one of: auto, cpu, cuda", NULL);
    /* duplicates */
    EXPECT_ERR("train:\n  steps: 5\n  seed: 2\n  steps: 6\n", 4, 3, "duplicate key `train.steps`",
               "first set at line 2");
    EXPECT_ERR("train:\n  steps: 5\nmodel:\n  hidden_size: 64\ntrain:\n  seed: 1\n", 5, 1,
               "duplicate key `train`", "first set at line 1");
    /* malformed YAML: libyaml's problem and mark */
    EXPECT_ERR("train:\n  steps: 5\n seed: 1\n", 3, 2, "malformed YAML: did not find expected key",
               "indentation");
    EXPECT_ERR("model:\n  hidden_size: [64\n", 3, 1, "malformed YAML", NULL);
    EXPECT_ERR("train:\n\tsteps: 5\n", 2, 1, "malformed YAML", NULL);
    EXPECT_ERR("train:\n  steps: 5\n---\ntrain:\n  steps: 6\n", 4, 1, "more than one YAML document",
               NULL);
    /* non-mapping where a section (or the whole file) is expected */
    EXPECT_ERR("train: 5\n", 1, 8, "section `train` must be a mapping, got a scalar",
               "followed by indented `key: value` lines");
    EXPECT_ERR("model:\n  - hidden_size: 64\n", 2, 3, "must be a mapping, got a sequence", NULL);
    EXPECT_ERR("- train\n", 1, 1, "expected a mapping at the top level, got a sequence", NULL);
    EXPECT_ERR("model:\n  [a, b]: 3\n", 2, 3, "expected a key name, got a sequence", NULL);
    /* string longer than the field */
    char *big = malloc(1200);
    if (big) {
        memcpy(big, "data:\n  path: ", 14);
        memset(big + 14, 'a', 1100);
        memcpy(big + 1114, "\n", 2);
        EXPECT_ERR(big, 2, 9, "at most 1023 allowed", NULL);
        free(big);
    }
    /* cross-field rule after loading: points at the line of the key the file set */
    EXPECT_ERR("model:\n  num_attention_heads: 4\n  hidden_size: 66\n", 3, 3,
               "model.hidden_size (66) is not divisible by model.num_attention_heads (4)", NULL);
    EXPECT_ERR("model:\n  hidden_size: 68\n", 2, 3, "head_dim", "hidden_size 72");
    /* bf16 moments with a beta above 0.99: at the optim.moments line, the fp32 hint */
    EXPECT_ERR(
        "optim:\n  beta2: 0.999\n  moments: bf16\n", 3, 3,
        "optim.moments bf16 needs optim.beta2 <= 0.99, got 0.999 (a decay 1 - beta2 = 0.001)",
        "use optim.moments: fp32");
    EXPECT_ERR("optim:\n  moments: BF16\n  beta1: 0.995\n", 2, 3, "optim.beta1 <= 0.99, got 0.995",
               "or optim.beta1 <= 0.99");
}

static void test_files(void) {
    moe_config c;
    moe_err err = {0};
    const char *path = test_src_path("tests/data/config/typo.yaml");
    char p[4096];
    snprintf(p, sizeof p, "%s", path);
    CHECK_INT_EQ(moe_config_load(&c, p, 0, NULL, &err), MOE_ERR_INPUT);
    CHECK(strcmp(err.file, p) == 0);
    CHECK_INT_EQ(err.line, 7);
    CHECK_INT_EQ(err.col, 3);
    CHECK(contains(err.hint, "did you mean `model.num_hidden_layers`?"));
    char out[2048];
    FILE *fp = fmemopen(out, sizeof out, "w");
    if (fp) {
        moe_err_print(&err, "moe-train", fp);
        fclose(fp);
        char want[4200];
        snprintf(want, sizeof want, "moe-train: error: %s:7:3: unknown key", p);
        CHECK_MSG(strncmp(out, want, strlen(want)) == 0, "printed: %s", out);
    }
    moe_err_clear(&err);
    snprintf(p, sizeof p, "%s", test_src_path("tests/data/config/cross_field.yaml"));
    CHECK_INT_EQ(moe_config_load(&c, p, 0, NULL, &err), MOE_ERR_INPUT);
    CHECK_INT_EQ(err.line, 6);
    CHECK_INT_EQ(err.col, 3);
    CHECK(contains(err.msg, "parallel.ep (3) does not divide model.num_local_experts (4)"));
    /* the override fixes it, and an override error names the override */
    moe_err_clear(&err);
    char *fix[] = {"parallel.ep=2"};
    CHECK_INT_EQ(moe_config_load(&c, p, 1, fix, &err), MOE_OK);
    CHECK_INT_EQ(c.parallel.ep, 2);
    moe_err_clear(&err);
    CHECK_INT_EQ(moe_config_load(&c, "no/such/config.yaml", 0, NULL, &err), MOE_ERR_INPUT);
    CHECK(contains(err.file, "no/such/config.yaml"));
}

static void test_overrides(void) {
    moe_config c;
    moe_err err = {0};
    char *ovs[] = {"train.steps=100", "model.num_hidden_layers=4",       "precision.recipe=BF16",
                   "device=cpu",      "data.path=\"a b/c.mtok\"",        "data.shuffle=no",
                   "optim.lr=1e-3",   "train.global_batch_tokens=8_192", "train.steps=120",
                   "log.json=",       "train.document_mask=false"};
    int n = (int)(sizeof ovs / sizeof ovs[0]);
    CHECK_INT_EQ(moe_config_load(&c, test_src_path("configs/tiny.yaml"), n, ovs, &err), MOE_OK);
    CHECK_INT_EQ(c.train.steps, 120); /* the later override wins */
    CHECK_INT_EQ(c.model.num_hidden_layers, 4);
    CHECK_INT_EQ(c.precision.recipe, MOE_RECIPE_BF16);
    CHECK_INT_EQ(c.device, MOE_DEVICE_CPU);
    CHECK(strcmp(c.data.path, "a b/c.mtok") == 0);
    CHECK(!c.data.shuffle);
    CHECK(!c.train.document_mask);
    CHECK_NEAR(c.optim.lr, 1e-3, 0);
    CHECK_INT_EQ(c.train.global_batch_tokens, 8192);
    CHECK(c.log.json[0] == '\0');
    EXPECT_OVERRIDE_ERR("train.stepz=5", "override 'train.stepz=5': unknown key `train.stepz`",
                        "did you mean `train.steps`?");
    EXPECT_OVERRIDE_ERR("trian.steps=5", "unknown key `trian.steps`",
                        "did you mean `train.steps`?");
    EXPECT_OVERRIDE_ERR("model.hiden_size=5", "unknown key", "did you mean `model.hidden_size`?");
    EXPECT_OVERRIDE_ERR("train.steps", "override 'train.steps': expected key.path=value",
                        "train.steps=100");
    EXPECT_OVERRIDE_ERR("=5", "expected key.path=value", NULL);
    EXPECT_OVERRIDE_ERR("train=5", "`train` is a section, not a key", "train.steps=200");
    EXPECT_OVERRIDE_ERR("train.steps=-1", "override 'train.steps=-1': `train.steps`: -1 is out",
                        "train.steps=200");
    EXPECT_OVERRIDE_ERR("precision.recipe=fp4", "one of: fp32, bf16, fp8-block, mxfp8", NULL);
    /* precision.skip_layers: indices in [-L, L) of the default 2 layers */
    EXPECT_OVERRIDE_ERR("precision.skip_layers=0,2", "'2' is not a layer index in [-2, 2)", NULL);
    EXPECT_OVERRIDE_ERR("precision.skip_layers=first", "'first' is not a layer index", NULL);
    EXPECT_OVERRIDE_ERR("precision.skip_layers=0,,1", "'' is not a layer index", NULL);
    /* precision.fp8_scale: each rule belongs to one recipe */
    EXPECT_OVERRIDE_ERR("precision.fp8_scale=pow2",
                        "precision.fp8_scale pow2 does not apply to precision.recipe fp32", NULL);
    EXPECT_OVERRIDE_ERR("precision.fp8_scale=ocp-floor",
                        "precision.fp8_scale ocp-floor does not apply", NULL);
    {
        moe_config sc;
        moe_err e = {0};
        uint8_t skip[2];
        moe_config_defaults(&sc);
        CHECK(moe_config_set(&sc, "precision.skip_layers", "-1", &e) == MOE_OK);
        CHECK(moe_config_validate(&sc, &e) == MOE_OK);
        CHECK(moe_config_skip_layers(&sc, skip, &e) == MOE_OK && skip[0] == 0 && skip[1] == 1);
        CHECK(moe_config_set(&sc, "precision.skip_layers", "0,-1", &e) == MOE_OK);
        CHECK(moe_config_skip_layers(&sc, skip, &e) == MOE_OK && skip[0] == 1 && skip[1] == 1);
        /* the recipe the ops run: the format with its scale rule */
        CHECK(moe_config_set(&sc, "precision.recipe", "fp8-block", &e) == MOE_OK);
        CHECK(moe_config_recipe(&sc) == MOE_RECIPE_FP8_BLOCK);
        CHECK(moe_config_set(&sc, "precision.fp8_scale", "pow2", &e) == MOE_OK);
        CHECK(moe_config_validate(&sc, &e) == MOE_OK);
        CHECK(moe_config_recipe(&sc) == MOE_RECIPE_FP8_BLOCK_POW2);
        CHECK(strcmp(moe_recipe_name(moe_config_recipe(&sc)), "fp8-block") == 0);
        /* precision.fp8_wgrad x-tiles: with either scale rule, fp8-block's name */
        CHECK(moe_config_set(&sc, "precision.fp8_wgrad", "x-tiles", &e) == MOE_OK);
        CHECK(moe_config_validate(&sc, &e) == MOE_OK);
        CHECK(moe_config_recipe(&sc) == MOE_RECIPE_FP8_BLOCK_POW2_XT);
        CHECK(moe_recipe_pow2(moe_config_recipe(&sc)) &&
              moe_recipe_wgrad_tiles(moe_config_recipe(&sc)));
        CHECK(strcmp(moe_recipe_name(moe_config_recipe(&sc)), "fp8-block") == 0);
        CHECK(moe_config_set(&sc, "precision.fp8_scale", "default", &e) == MOE_OK);
        CHECK(moe_config_recipe(&sc) == MOE_RECIPE_FP8_BLOCK_XT);
        CHECK(!moe_recipe_pow2(moe_config_recipe(&sc)) &&
              moe_recipe_wgrad_tiles(moe_config_recipe(&sc)));
        CHECK(moe_recipe_format(moe_config_recipe(&sc)) == MOE_RECIPE_FP8_BLOCK);
        CHECK(moe_config_set(&sc, "precision.recipe", "bf16", &e) == MOE_OK);
        CHECK(moe_config_validate(&sc, &e) == MOE_ERR_INPUT); /* x-tiles is fp8-block's */
        CHECK(strstr(e.msg, "precision.fp8_wgrad") != NULL);
        CHECK(moe_config_set(&sc, "precision.fp8_wgrad", "tiles", &e) == MOE_ERR_INPUT);
        CHECK(moe_config_set(&sc, "precision.fp8_wgrad", "blocks", &e) == MOE_OK);
        CHECK(moe_config_set(&sc, "precision.fp8_scale", "pow2", &e) == MOE_OK);
        CHECK(moe_config_set(&sc, "precision.recipe", "mxfp8", &e) == MOE_OK);
        CHECK(moe_config_validate(&sc, &e) == MOE_ERR_INPUT);
        CHECK(moe_config_set(&sc, "precision.fp8_scale", "ocp-floor", &e) == MOE_OK);
        CHECK(moe_config_recipe(&sc) == MOE_RECIPE_MXFP8_FLOOR);
    }
    EXPECT_OVERRIDE_ERR("model.num_attention_heads=3",
                        "after override 'model.num_attention_heads=3'", NULL);
    /* moe_config_set alone: no cross-field validation, but type and range checks */
    moe_config_defaults(&c);
    CHECK_INT_EQ(moe_config_set(&c, "optim.schedule", "Linear", &err), MOE_OK);
    CHECK_INT_EQ(c.optim.schedule, MOE_SCHED_LINEAR);
    CHECK_INT_EQ(moe_config_set(&c, "model.tie_word_embeddings", "TRUE", &err), MOE_OK);
    CHECK(c.model.tie_word_embeddings);
    CHECK_INT_EQ(moe_config_set(&c, "train.warmup_steps", "5", &err), MOE_ERR_INPUT);
    CHECK(contains(err.hint, "did you mean `optim.warmup_steps`?"));
}

static void test_cross_field(void) {
    EXPECT_INVALID("is not divisible by model.num_attention_heads", "model.hidden_size", "100",
                   "model.num_attention_heads", "8");
    EXPECT_INVALID("is odd", "model.hidden_size", "60", "model.num_attention_heads", "4");
    EXPECT_INVALID("not divisible by model.num_key_value_heads (3)", "model.num_attention_heads",
                   "4", "model.num_key_value_heads", "3");
    EXPECT_INVALID("model.num_experts_per_tok (5) is larger than model.num_local_experts (4)",
                   "model.num_experts_per_tok", "5");
    EXPECT_INVALID("train.seq_len (8192) exceeds model.max_position_embeddings (4096)",
                   "train.seq_len", "8192", "train.global_batch_tokens", "8192");
    EXPECT_INVALID("train.global_batch_tokens (5000) is not a multiple of train.seq_len (256)",
                   "train.global_batch_tokens", "5000");
    EXPECT_INVALID("x parallel.dp (3) x parallel.ep (2)", "parallel.dp", "3", "parallel.ep", "2");
    EXPECT_INVALID("train.micro_batch_tokens (300) is not a multiple", "train.micro_batch_tokens",
                   "300");
    EXPECT_INVALID("train.micro_batch_tokens (1536) does not divide", "train.micro_batch_tokens",
                   "1536");
    EXPECT_INVALID("micro-batches of a step (train.global_batch_tokens / train.micro_batch_tokens) "
                   "are not a multiple of the 2 ranks",
                   "parallel.dp", "2", "train.micro_batch_tokens", "4096");
    EXPECT_INVALID("train.eval_tokens (1000) is not a multiple", "train.eval_tokens", "1000");
    EXPECT_INVALID("optim.min_lr (0.01) is larger than optim.lr (0.003)", "optim.min_lr", "0.01");
    EXPECT_INVALID("optim.warmup_steps (30) exceeds train.steps (20)", "train.steps", "20",
                   "optim.warmup_steps", "30");
    EXPECT_INVALID("parallel.ep (3) does not divide model.num_local_experts (4)", "parallel.ep",
                   "3");
    EXPECT_INVALID("optim.moments bf16 needs optim.beta2 <= 0.99, got 0.999", "optim.moments",
                   "bf16", "optim.beta2", "0.999");
    EXPECT_INVALID("optim.moments bf16 needs optim.beta1 <= 0.99, got 0.995", "optim.moments",
                   "bf16", "optim.beta1", "0.995");
    /* a split master is a bf16 copy plus low bits: bf16 only (the default recipe is fp32) */
    EXPECT_INVALID("optim.master split needs precision.recipe bf16, got fp32", "optim.master",
                   "split");
    EXPECT_INVALID("optim.master split needs precision.recipe bf16, got fp8-block", "optim.master",
                   "split", "precision.recipe", "fp8-block");
    EXPECT_INVALID("optim.master split needs precision.recipe bf16, got mxfp8", "optim.master",
                   "split", "precision.recipe", "mxfp8");
    /* valid edge cases */
    moe_config c;
    moe_err err = {0};
    moe_config_defaults(&c);
    c.train.micro_batch_tokens = 1024;
    c.model.num_experts_per_tok = c.model.num_local_experts;
    c.optim.warmup_steps = c.train.steps;
    c.optim.min_lr = c.optim.lr;
    c.train.seq_len = c.model.max_position_embeddings;
    c.train.global_batch_tokens = c.train.seq_len;
    c.train.micro_batch_tokens = 0;
    c.train.eval_tokens = 0;
    CHECK_INT_EQ(moe_config_validate(&c, &err), MOE_OK);
    c.optim.moments = MOE_DTYPE_BF16; /* betas of 0.99 (the limit) and the defaults pass */
    c.optim.beta1 = c.optim.beta2 = 0.99;
    CHECK_INT_EQ(moe_config_validate(&c, &err), MOE_OK);
    c.optim.beta2 = 0.999; /* fp32 moments take any beta below 1 */
    c.optim.moments = MOE_DTYPE_F32;
    CHECK_INT_EQ(moe_config_validate(&c, &err), MOE_OK);
    c.optim.master = MOE_MASTER_SPLIT; /* with the bf16 recipe */
    c.precision.recipe = MOE_RECIPE_BF16;
    CHECK_INT_EQ(moe_config_validate(&c, &err), MOE_OK);
    CHECK(strcmp(moe_master_name(c.optim.master), "split") == 0);
    moe_config_defaults(&c); /* 4 ranks share 8 micro-batches of 512 tokens */
    c.parallel.dp = 4;
    c.train.micro_batch_tokens = 512;
    CHECK_INT_EQ(moe_config_validate(&c, &err), MOE_OK);
    int64_t seqs = 0, count = 0;
    moe_config_micro_batch(&c, &seqs, &count);
    CHECK_INT_EQ(seqs, 512 / c.train.seq_len);
    CHECK_INT_EQ(count, c.train.global_batch_tokens / 512);
    c.train.micro_batch_tokens = 0; /* one micro-batch per rank: global / (dp x ep) tokens */
    moe_config_micro_batch(&c, &seqs, &count);
    CHECK_INT_EQ(seqs, c.train.global_batch_tokens / 4 / c.train.seq_len);
    CHECK_INT_EQ(count, 4);
    /* a struct edited directly is range-checked too */
    c.precision.recipe = (moe_recipe)7;
    CHECK_INT_EQ(moe_config_validate(&c, &err), MOE_ERR_INPUT);
    CHECK(contains(err.msg, "precision.recipe"));
}

static void test_docs(void) {
    char *gen = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&gen, &len);
    CHECK(fp != NULL);
    if (!fp) return;
    moe_config_write_markdown(fp);
    fclose(fp);
    for (int i = 0; i < moe_cfg_n_keys; i++)
        CHECK_MSG(contains(gen, moe_cfg_keys[i].key), "docs lack %s", moe_cfg_keys[i].key);
    const char *path = test_src_path("docs/config.md");
    const char *regen = getenv("MOE_REGEN_DOCS");
    if (regen && strcmp(regen, "1") == 0) {
        moe_outfile out;
        moe_err err = {0};
        if (moe_outfile_open(&out, path, &err) || moe_outfile_write(&out, gen, len, &err) ||
            moe_outfile_commit(&out, &err)) {
            moe_err_print(&err, "unit_test_config", stderr);
            test_fail(__FILE__, __LINE__, "could not regenerate %s", path);
        } else {
            fprintf(stderr, "regenerated %s\n", path);
        }
    }
    char *have = NULL;
    size_t have_len = 0;
    moe_err err = {0};
    if (moe_read_file(path, &have, &have_len, &err) != MOE_OK) {
        test_fail(__FILE__, __LINE__, "cannot read %s: %s", path, err.msg);
    } else if (have_len != len || memcmp(have, gen, len) != 0) {
        test_fail(__FILE__, __LINE__,
                  "%s is stale: it differs from moe_config_write_markdown().\n"
                  "  Regenerate it: MOE_REGEN_DOCS=1 MOE_SRC_DIR=<checkout> "
                  "<build>/tests/unit_test_config",
                  path);
    }
    test_checks++;
    free(have);
    free(gen);
}

int main(void) {
    test_schema_table();
    test_defaults();
    test_configs_and_round_trip();
    test_errors();
    test_files();
    test_overrides();
    test_cross_field();
    test_docs();
    return test_summary("unit.config");
}
