/* test_backend: the backend lifecycle and capability layer (src/ops/backend.c).
 *
 * 1. moe_backend_open: "cpu" gives the CPU reference and destroy is harmless; "auto" always
 *    gives a backend (the CPU without a usable GPU); names that are not devices ("bogus",
 *    "cuda:x", "CPU", "") and devices that cannot exist ("cuda:4000") are input errors; a
 *    backend opens for every recipe the CPU emulates, fp8 ones included.
 * 2. supports with sizes: a table whose supports refuses one shape (attention at head dim 80,
 *    what the CUDA bf16 kernels do) makes moe_backend_check and moe_model_create fail with
 *    MOE_ERR_INPUT naming the op and the size, before the model allocates anything; other
 *    shapes go through.
 * 3. The scratch estimate needs no device: 0 for the CPU, the cuBLASLt workspace and more for
 *    CUDA (more under bf16, whose operands are copied), and it is the model estimate's
 *    gpu_scratch.
 * 4. moe_backend_rank_device: a rank's "cuda" becomes its local rank's GPU, other names stay;
 *    a local rank beyond the visible GPUs is an input error naming both and
 *    CUDA_VISIBLE_DEVICES. */
#include <stdlib.h>
#include <string.h>

#include "moe/config.h"
#include "moe/model.h"
#include "moe/ops.h"
#include "testlib.h"

static void test_open(void) {
    moe_err err;
    moe_err_clear(&err);
    const moe_backend *be = moe_backend_open("cpu", MOE_RECIPE_FP32, 0, &err);
    CHECK(be == moe_backend_cpu());
    CHECK_INT_EQ(err.status, MOE_OK);
    if (be) {
        CHECK(strcmp(be->name, "cpu") == 0 && be->bf16_native == 0);
        size_t cur = 1, peak = 1;
        be->memory(be, &cur, &peak);
        CHECK(cur == 0 && peak == 0);
        be->destroy(be); /* static table: still usable afterwards */
        CHECK(moe_backend_cpu()->supports(moe_backend_cpu(), MOE_OP_ADD, NULL, MOE_RECIPE_FP32));
    }
    be = moe_backend_open("auto", MOE_RECIPE_BF16, 0, &err);
    CHECK_MSG(be != NULL, "auto: %s", err.msg);
    if (be) {
        CHECK(strcmp(be->name, "cpu") == 0 || strcmp(be->name, "cuda") == 0);
        be->destroy(be);
    }
    const char *bad[] = {"bogus", "cuda:x", "cuda:", "CPU", "", "cuda:-1", "cuda:99999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        moe_err_clear(&err);
        CHECK_MSG(moe_backend_open(bad[i], MOE_RECIPE_FP32, 0, &err) == NULL, "'%s'", bad[i]);
        CHECK_INT_EQ(err.status, MOE_ERR_INPUT);
        CHECK_MSG(strstr(err.msg, "unknown device") && strstr(err.msg, bad[i]), "'%s': %s", bad[i],
                  err.msg);
        CHECK(err.hint[0] != '\0');
    }
    /* a well-formed GPU number no machine has: no CUDA in this build, no GPU, or no device
     * 4000 - an input error in every case */
    moe_err_clear(&err);
    CHECK(moe_backend_open("cuda:4000", MOE_RECIPE_FP32, 0, &err) == NULL);
    CHECK_INT_EQ(err.status, MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.msg, "device: cuda:4000 was requested"), "%s", err.msg);
    /* "cuda" works on a GPU machine; anywhere else it says why not */
    moe_err_clear(&err);
    be = moe_backend_open("cuda", MOE_RECIPE_FP32, 0, &err);
    if (be) {
        CHECK(strcmp(be->name, "cuda") == 0 && be->bf16_native == 1);
        be->destroy(be);
    } else {
        CHECK_INT_EQ(err.status, MOE_ERR_INPUT);
        CHECK_MSG(strstr(err.msg, "device: cuda was requested"), "%s", err.msg);
    }
    moe_err_clear(&err);
    /* the CPU emulates the fp8 recipes (a backend without them: test_supports_shapes) */
    const moe_backend *be8 = moe_backend_open("cpu", MOE_RECIPE_FP8_BLOCK, 0, &err);
    CHECK_MSG(be8 != NULL, "%s", err.msg);
    if (be8) be8->destroy(be8);
}

/* ---- a CPU table that refuses attention at head dim 80 and the fp8 recipes (as the CUDA
 * backend does today), and counts allocations ---- */

static int n_allocs;

static int refusing_supports(const moe_backend *be, moe_op op, const moe_op_dims *d,
                             moe_recipe prec) {
    (void)be;
    if (op == MOE_OP_ATTENTION && d && d->D == 80) return 0;
    if (prec == MOE_RECIPE_FP8_BLOCK || prec == MOE_RECIPE_MXFP8) return 0;
    const moe_backend *cpu = moe_backend_cpu();
    return cpu->supports(cpu, op, d, prec);
}

static void *counting_alloc(const moe_backend *be, size_t bytes) {
    (void)be;
    n_allocs++;
    return moe_backend_cpu()->alloc(moe_backend_cpu(), bytes);
}

static void test_supports_shapes(void) {
    moe_backend fake = *moe_backend_cpu(); /* the CPU entries ignore be (ctx NULL) */
    fake.name = "picky";
    fake.supports = refusing_supports;
    fake.alloc = counting_alloc;
    moe_config c;
    moe_config_defaults(&c);
    moe_model_config cfg = c.model;
    cfg.num_attention_heads = 2;
    cfg.num_key_value_heads = 2;
    cfg.hidden_size = 160; /* head dim 80 */
    moe_op_dims d;
    moe_model_op_dims(&cfg, 2, 16, &d);
    CHECK_INT_EQ(d.D, 80);
    CHECK(d.B == 2 && d.T == 16 && d.E == cfg.num_local_experts && d.V == cfg.vocab_size);
    /* the CPU reference runs every shape */
    const moe_backend *cpu = moe_backend_cpu();
    CHECK(cpu->supports(cpu, MOE_OP_ATTENTION, &d, MOE_RECIPE_BF16));
    CHECK(moe_backend_check(cpu, &d, MOE_RECIPE_BF16, NULL) == MOE_OK);
    CHECK(cpu->supports(cpu, MOE_OP_MATMUL, &d, MOE_RECIPE_MXFP8)); /* emulated */

    moe_err err;
    moe_err_clear(&err);
    CHECK(moe_backend_check(&fake, &d, MOE_RECIPE_FP32, &err) == MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.msg, "picky backend") && strstr(err.msg, "op attention") &&
                  strstr(err.msg, "D=80") && strstr(err.msg, "fp32"),
              "%s", err.msg);
    CHECK(moe_backend_check(&fake, NULL, MOE_RECIPE_FP32, NULL) == MOE_OK); /* recipe alone */
    moe_err_clear(&err);
    CHECK(moe_backend_check(&fake, NULL, MOE_RECIPE_FP8_BLOCK, &err) == MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.msg, "fp8-block") && strstr(err.msg, "picky backend") &&
                  strstr(err.msg, "fp8 GEMM"),
              "%s", err.msg);

    moe_model m;
    moe_err_clear(&err);
    n_allocs = 0;
    CHECK(moe_model_create(&m, &cfg, MOE_RECIPE_FP32, MOE_RECOMPUTE_NONE, &fake, 2, 16, &err) ==
          MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.msg, "attention") && strstr(err.msg, "D=80"), "%s", err.msg);
    CHECK_INT_EQ(n_allocs, 0); /* refused before any work */
    moe_model_free(&m);
    cfg.hidden_size = 128; /* head dim 64 goes through */
    moe_err_clear(&err);
    CHECK(moe_model_create(&m, &cfg, MOE_RECIPE_FP32, MOE_RECOMPUTE_NONE, &fake, 2, 16, &err) ==
          MOE_OK);
    CHECK(n_allocs > 0);
    moe_model_free(&m);
}

static void test_scratch_estimate(void) {
    moe_config c;
    moe_config_defaults(&c);
    moe_op_dims d;
    moe_model_op_dims(&c.model, 4, 64, &d);
    int64_t f32 = moe_backend_scratch_estimate("cuda", &d, MOE_RECIPE_FP32, 0);
    int64_t b16 = moe_backend_scratch_estimate("cuda", &d, MOE_RECIPE_BF16, 0);
    CHECK(f32 > ((int64_t)32 << 20)); /* the cuBLASLt workspace and the small buffers */
    CHECK(b16 > f32);
    CHECK_INT_EQ(moe_backend_scratch_estimate("cpu", &d, MOE_RECIPE_BF16, 0), 0);
    CHECK_INT_EQ(moe_backend_scratch_estimate("tpu", &d, MOE_RECIPE_BF16, 0), 0);
    /* mxfp8 (either scale rule) adds its quantized operands: its weights are quantized at
     * each call, so more than fp8-block's activations alone */
    CHECK(moe_backend_scratch_estimate("cuda", &d, MOE_RECIPE_MXFP8, 0) > b16);
    CHECK_INT_EQ(moe_backend_scratch_estimate("cuda", &d, MOE_RECIPE_MXFP8_FLOOR, 0),
                 moe_backend_scratch_estimate("cuda", &d, MOE_RECIPE_MXFP8, 0));
    CHECK_INT_EQ(moe_backend_scratch_estimate("cpu", &d, MOE_RECIPE_MXFP8, 0), 0);
    const int64_t fp8 = moe_backend_scratch_estimate("cuda", &d, MOE_RECIPE_FP8_BLOCK, 0);
    CHECK(fp8 > b16);
    /* only fp8-block depends on the device and precision.skip_layers: on sm_90 the experts'
     * F-wide operands are activation pairs (less scratch), skipped layers convert their fp32
     * weights (more); the other recipes' figures are the same either way */
    const unsigned both = MOE_SCRATCH_SM90 | MOE_SCRATCH_SKIPPED;
    const int64_t fp8_sm90 =
        moe_backend_scratch_estimate("cuda", &d, MOE_RECIPE_FP8_BLOCK, MOE_SCRATCH_SM90);
    CHECK(fp8_sm90 < fp8);
    CHECK(moe_backend_scratch_estimate("cuda", &d, MOE_RECIPE_FP8_BLOCK, MOE_SCRATCH_SKIPPED) >
          fp8);
    CHECK(moe_backend_scratch_estimate("cuda", &d, MOE_RECIPE_FP8_BLOCK, both) > fp8_sm90);
    CHECK_INT_EQ(moe_backend_scratch_estimate("cuda", &d, MOE_RECIPE_BF16, both), b16);
    CHECK_INT_EQ(moe_backend_scratch_estimate("cuda", &d, MOE_RECIPE_MXFP8, both),
                 moe_backend_scratch_estimate("cuda", &d, MOE_RECIPE_MXFP8, 0));
    moe_model_memory mem;
    moe_model_memory_estimate(&c.model, MOE_RECIPE_BF16, MOE_RECOMPUTE_NONE, 4, 64, 1, NULL,
                              MOE_DTYPE_F32, MOE_DTYPE_F32, MOE_MASTER_FP32, &mem);
    CHECK_INT_EQ(mem.gpu_scratch, b16);
    CHECK_INT_EQ(mem.gpu_scratch_other, b16);
    moe_model_memory_estimate(&c.model, MOE_RECIPE_FP8_BLOCK, MOE_RECOMPUTE_NONE, 4, 64, 1, NULL,
                              MOE_DTYPE_F32, MOE_DTYPE_F32, MOE_MASTER_FP32, &mem);
    CHECK_INT_EQ(mem.gpu_scratch, fp8_sm90);
    CHECK_INT_EQ(mem.gpu_scratch_other, fp8);
}

static void test_rank_device(void) {
    char out[32];
    moe_err err;
    moe_err_clear(&err);
    CHECK(moe_backend_rank_device("cuda", 3, 8, out, sizeof out, &err) == MOE_OK);
    CHECK(strcmp(out, "cuda:3") == 0);
    CHECK(moe_backend_rank_device("cuda", 0, 0, out, sizeof out, &err) == MOE_OK);
    CHECK(strcmp(out, "cuda:0") == 0); /* no GPU: moe_backend_open("cuda:0") says so */
    const char *kept[] = {"cpu", "auto", "cuda:5"};
    for (int i = 0; i < 3; i++) {
        CHECK(moe_backend_rank_device(kept[i], 2, 4, out, sizeof out, &err) == MOE_OK);
        CHECK(strcmp(out, kept[i]) == 0);
    }
    setenv("CUDA_VISIBLE_DEVICES", "2,3", 1);
    CHECK(moe_backend_rank_device("cuda", 2, 2, out, sizeof out, &err) == MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.msg, "local rank 2") && strstr(err.msg, "sees 2 GPUs") &&
                  strstr(err.msg, "CUDA_VISIBLE_DEVICES=2,3"),
              "%s", err.msg);
    CHECK_MSG(strstr(err.hint, "device=cuda:N"), "%s", err.hint);
    unsetenv("CUDA_VISIBLE_DEVICES");
}

int main(void) {
    test_open();
    test_rank_device();
    test_supports_shapes();
    test_scratch_estimate();
    return test_summary("test_backend");
}
