/* config_schema: the table of every configuration key, and everything that only reads it:
 * defaults, value parsing/formatting, the YAML dump and the generated docs/config.md.
 *
 * The one thing to know: a key exists when it has a row in moe_cfg_keys[] and a field in
 * moe_config (moe/config.h). Defaults are stored as YAML text and parsed by the same code
 * as a file value, so the documented default is the applied default. Reading YAML and
 * validation live in config.c. */
#include "io/config_schema.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Adding a field to moe_config means adding its row below: this size is the reminder (x86-64
 * and aarch64 LP64), and unit.config checks that only padding is left without a row. */
_Static_assert(sizeof(void *) != 8 || sizeof(moe_config) == 3704,
               "moe_config changed: update moe_cfg_keys[] and this size together");
_Static_assert(sizeof(moe_device_kind) == sizeof(int), "enum fields are stored as int");
_Static_assert(sizeof(moe_recipe) == sizeof(int), "enum fields are stored as int");
_Static_assert(sizeof(moe_fp8_scale) == sizeof(int), "enum fields are stored as int");
_Static_assert(sizeof(moe_fp8_wgrad) == sizeof(int), "enum fields are stored as int");
_Static_assert(sizeof(moe_lr_schedule) == sizeof(int), "enum fields are stored as int");
_Static_assert(sizeof(moe_recompute) == sizeof(int), "enum fields are stored as int");
_Static_assert(sizeof(moe_stop_signal) == sizeof(int), "enum fields are stored as int");
_Static_assert(sizeof(moe_dtype) == sizeof(int), "enum fields are stored as int");
_Static_assert(sizeof(moe_master) == sizeof(int), "enum fields are stored as int");
/* optim.moments and optim.expert_grads store the moe_dtype itself: the names below index it */
_Static_assert(MOE_DTYPE_F32 == 0 && MOE_DTYPE_BF16 == 1, "moments_names index moe_dtype");

static const char *const device_names[] = {"auto", "cpu", "cuda", NULL};
static const char *const recipe_names[] = {"fp32", "bf16", "fp8-block", "mxfp8", NULL};
static const char *const fp8_scale_names[] = {"default", "pow2", "ocp-floor", NULL};
static const char *const fp8_wgrad_names[] = {"blocks", "x-tiles", NULL};
static const char *const schedule_names[] = {"cosine", "linear", "constant", NULL};
static const char *const recompute_names[] = {"none", "attn", "moe", "full", NULL};
static const char *const stop_signal_names[] = {"usr1", "usr2", "hup", "none", NULL};
static const char *const moments_names[] = {"fp32", "bf16", NULL};
static const char *const master_names[] = {"fp32", "split", NULL};

/* Where a field lives: offset and size inside moe_config. */
#define FIELD(f) offsetof(moe_config, f), sizeof(((moe_config *)0)->f)
#define MIN_MAX (MOE_CFG_HAS_MIN | MOE_CFG_HAS_MAX)
#define MIN_ONLY MOE_CFG_HAS_MIN
#define POSITIVE (MOE_CFG_HAS_MIN | MOE_CFG_MIN_EXCL)
#define I32_MAX 2147483647.0
#define I64_MAX 9223372036854775807.0

const moe_cfg_section moe_cfg_sections[] = {
    {"", "Keys outside any section."},
    {"model", "Model shape and losses; Hugging Face `MixtralConfig` names, so `config.json` "
              "export is a copy."},
    {"data", "Training and validation data (token shards written by `moe-tokenize`)."},
    {"train", "Run length, batch geometry, evaluation and determinism."},
    {"optim", "AdamW with fp32 master weights (held as fp32, or split into the bf16 copy and "
              "16 low bits), fp32 or bf16 moments and expert gradients, and the learning-rate "
              "schedule."},
    {"precision", "Numeric recipe of the matrix multiplications (master weights, losses, "
                  "softmax, norms and router always stay fp32; the optimizer moments and the "
                  "experts' gradients too unless `optim.moments: bf16`, "
                  "`optim.expert_grads: bf16`)."},
    {"parallel", "Data and expert parallelism: world size = dp x ep ranks."},
    {"checkpoint", "Checkpoint cadence and retention (`ckpt-<step>/` in the run directory)."},
    {"log", "Metrics logging."},
};
const int moe_cfg_n_sections = (int)(sizeof moe_cfg_sections / sizeof moe_cfg_sections[0]);

const moe_cfg_key moe_cfg_keys[] = {
    {"device", MOE_CFG_ENUM, FIELD(device), "auto", 0, 0, 0, device_names,
     "Where to run: auto picks cuda when a GPU is visible, else cpu."},

    {"model.vocab_size", MOE_CFG_INT, FIELD(model.vocab_size), "256", MIN_MAX, 2, I32_MAX, NULL,
     "Vocabulary size; must match the tokenizer of the data (256 for the byte tokenizer)."},
    {"model.hidden_size", MOE_CFG_INT, FIELD(model.hidden_size), "64", MIN_MAX, 2, 65536, NULL,
     "Model width C (residual stream)."},
    {"model.intermediate_size", MOE_CFG_INT, FIELD(model.intermediate_size), "128", MIN_MAX, 1,
     262144, NULL, "Hidden width of each SwiGLU expert (w1/w3 out, w2 in)."},
    {"model.num_hidden_layers", MOE_CFG_INT, FIELD(model.num_hidden_layers), "2", MIN_MAX, 1, 1024,
     NULL, "Number of transformer layers."},
    {"model.num_attention_heads", MOE_CFG_INT, FIELD(model.num_attention_heads), "4", MIN_MAX, 1,
     1024, NULL, "Query heads; head_dim = hidden_size / num_attention_heads (even, RoPE)."},
    {"model.num_key_value_heads", MOE_CFG_INT, FIELD(model.num_key_value_heads), "2", MIN_MAX, 1,
     1024, NULL, "Key/value heads (grouped-query attention); divides num_attention_heads."},
    {"model.num_local_experts", MOE_CFG_INT, FIELD(model.num_local_experts), "4", MIN_MAX, 1, 1024,
     NULL, "Experts per MoE layer (E)."},
    {"model.num_experts_per_tok", MOE_CFG_INT, FIELD(model.num_experts_per_tok), "2", MIN_MAX, 1,
     1024, NULL, "Experts each token is routed to (top-k); at most num_local_experts."},
    {"model.max_position_embeddings", MOE_CFG_INT, FIELD(model.max_position_embeddings), "4096",
     MIN_MAX, 1, 16777216, NULL, "Longest sequence the model is meant for; >= train.seq_len."},
    {"model.rope_theta", MOE_CFG_FLOAT, FIELD(model.rope_theta), "10000.0", POSITIVE, 0, 0, NULL,
     "RoPE base frequency."},
    {"model.rms_norm_eps", MOE_CFG_FLOAT, FIELD(model.rms_norm_eps), "1.0e-05",
     POSITIVE | MOE_CFG_HAS_MAX, 0, 1, NULL, "Epsilon inside every RMSNorm."},
    {"model.router_aux_loss_coef", MOE_CFG_FLOAT, FIELD(model.router_aux_loss_coef), "0.02",
     MIN_ONLY, 0, 0, NULL, "Weight of the load-balancing loss E * sum_e f_e * P_e."},
    {"model.router_z_loss_coef", MOE_CFG_FLOAT, FIELD(model.router_z_loss_coef), "0.001", MIN_ONLY,
     0, 0, NULL, "Weight of the router z-loss (mean squared logsumexp of logits)."},
    {"model.initializer_range", MOE_CFG_FLOAT, FIELD(model.initializer_range), "0.02",
     POSITIVE | MOE_CFG_HAS_MAX, 0, 1, NULL, "Standard deviation of the normal weight init."},
    {"model.tie_word_embeddings", MOE_CFG_BOOL, FIELD(model.tie_word_embeddings), "false", 0, 0, 0,
     NULL, "Share lm_head.weight with model.embed_tokens.weight."},

    {"data.path", MOE_CFG_STRING, FIELD(data.path), "\"\"", 0, 0, 0, NULL,
     "Training shards: a `.mtok` file, a directory of them, a manifest, or `-` (stdin); "
     "empty = given on the command line (`--data`)."},
    {"data.val_path", MOE_CFG_STRING, FIELD(data.val_path), "\"\"", 0, 0, 0, NULL,
     "Validation shards; empty = the `*.val.mtok` companions of data.path, if any."},
    {"data.shuffle", MOE_CFG_BOOL, FIELD(data.shuffle), "true", 0, 0, 0, NULL,
     "Shuffle training samples each epoch (deterministically, from train.seed)."},
    {"data.lowercase_weight", MOE_CFG_FLOAT, FIELD(data.lowercase_weight), "1.0", MIN_MAX, 0, 1,
     NULL, "Loss weight of lowercase (soft-masked) bases when the shards carry a mask."},

    {"train.steps", MOE_CFG_INT, FIELD(train.steps), "200", MIN_MAX, 1, I64_MAX, NULL,
     "Optimizer steps of the whole run (the LR schedule depends on it)."},
    {"train.seq_len", MOE_CFG_INT, FIELD(train.seq_len), "256", MIN_MAX, 1, 16777216, NULL,
     "Tokens per training sample (context length)."},
    {"train.global_batch_tokens", MOE_CFG_INT, FIELD(train.global_batch_tokens), "4096", MIN_MAX, 1,
     I64_MAX, NULL, "Tokens per optimizer step over all ranks; a multiple of seq_len x dp x ep."},
    {"train.micro_batch_tokens", MOE_CFG_INT, FIELD(train.micro_batch_tokens), "0", MIN_MAX, 0,
     I64_MAX, NULL,
     "Tokens per forward/backward of one rank; a step runs global / micro of them, shared by "
     "the dp x ep ranks (gradient accumulation); 0 = global / (dp x ep), one per rank."},
    {"train.seed", MOE_CFG_INT, FIELD(train.seed), "1234", MIN_MAX, 0, I64_MAX, NULL,
     "Seed of weight init, data order and every other random choice."},
    {"train.eval_every", MOE_CFG_INT, FIELD(train.eval_every), "50", MIN_MAX, 0, I64_MAX, NULL,
     "Evaluate on the validation set every N steps; 0 = only at the end."},
    {"train.eval_tokens", MOE_CFG_INT, FIELD(train.eval_tokens), "16384", MIN_MAX, 0, I64_MAX, NULL,
     "Validation tokens per evaluation, a multiple of seq_len; 0 = the whole set."},
    {"train.recompute", MOE_CFG_ENUM, FIELD(train.recompute), "none", 0, 0, 0, recompute_names,
     "Activation recomputation in backward: none (but the SwiGLU output, one elementwise pass a "
     "layer), attention, MoE block, or whole layers."},
    {"train.document_mask", MOE_CFG_BOOL, FIELD(train.document_mask), "true", 0, 0, 0, NULL,
     "Keep the documents packed into one sample apart: a token attends only to its own "
     "document, RoPE positions restart at each document, and the EOS ending a document "
     "predicts nothing; false = plain causal attention over the whole sample."},
    {"train.max_bad_steps", MOE_CFG_INT, FIELD(train.max_bad_steps), "3", MIN_MAX, 0, I64_MAX, NULL,
     "Steps with a non-finite loss or gradient are skipped (no update) and counted; more than "
     "this many in a row end the run (exit 1) with the last checkpoint intact; 0 = the first."},
    {"train.stop_signal", MOE_CFG_ENUM, FIELD(train.stop_signal), "usr1", 0, 0, 0,
     stop_signal_names,
     "Signal that, like SIGTERM and SIGINT, makes moe-train finish the step, write a "
     "checkpoint and exit 0 (Slurm: `#SBATCH --signal=USR1@120`); none = only those two."},
    {"train.deterministic", MOE_CFG_BOOL, FIELD(train.deterministic), "true", 0, 0, 0, NULL,
     "Bit-reproducible runs (same inputs, seed and world size -> same bytes). Every backend "
     "is deterministic today, so false changes nothing: no faster non-reproducible path exists "
     "(cuBLASLt algorithms chosen by timing were measured and dropped, "
     "docs/performance-gpu.md)."},

    {"optim.lr", MOE_CFG_FLOAT, FIELD(optim.lr), "0.003", POSITIVE | MOE_CFG_HAS_MAX, 0, 10, NULL,
     "Peak learning rate (reached at the end of warmup)."},
    {"optim.min_lr", MOE_CFG_FLOAT, FIELD(optim.min_lr), "0.0003", MIN_MAX, 0, 10, NULL,
     "Learning-rate floor of the cosine/linear decay; <= lr."},
    {"optim.warmup_steps", MOE_CFG_INT, FIELD(optim.warmup_steps), "20", MIN_MAX, 0, I64_MAX, NULL,
     "Linear warmup from 0 to lr over this many steps; <= train.steps."},
    {"optim.schedule", MOE_CFG_ENUM, FIELD(optim.schedule), "cosine", 0, 0, 0, schedule_names,
     "Decay after warmup, from lr to min_lr at train.steps."},
    {"optim.weight_decay", MOE_CFG_FLOAT, FIELD(optim.weight_decay), "0.1", MIN_MAX, 0, 10, NULL,
     "Decoupled (AdamW) weight decay of matrices."},
    {"optim.beta1", MOE_CFG_FLOAT, FIELD(optim.beta1), "0.9", MIN_MAX | MOE_CFG_MAX_EXCL, 0, 1,
     NULL, "AdamW first-moment decay."},
    {"optim.beta2", MOE_CFG_FLOAT, FIELD(optim.beta2), "0.95", MIN_MAX | MOE_CFG_MAX_EXCL, 0, 1,
     NULL, "AdamW second-moment decay."},
    {"optim.eps", MOE_CFG_FLOAT, FIELD(optim.eps), "1.0e-08", POSITIVE | MOE_CFG_HAS_MAX, 0, 1,
     NULL, "AdamW denominator epsilon."},
    {"optim.grad_clip", MOE_CFG_FLOAT, FIELD(optim.grad_clip), "1.0", MIN_ONLY, 0, 0, NULL,
     "Clip the global gradient norm to this value; 0 = no clipping."},
    {"optim.decay_norms_and_embeddings", MOE_CFG_BOOL, FIELD(optim.decay_norms_and_embeddings),
     "false", 0, 0, 0, NULL, "Also apply weight decay to norm weights and embeddings."},
    {"optim.moments", MOE_CFG_ENUM, FIELD(optim.moments), "fp32", 0, 0, 0, moments_names,
     "Storage of the AdamW moments m and v: fp32, or bf16 (half their memory and of their "
     "bytes moved per step; each new moment rounded to nearest even and the update computed "
     "from the stored value; optim.beta1 and optim.beta2 at most 0.99). Master weights stay "
     "fp32, and the gradients unless optim.expert_grads; checkpoints hold fp32 either way. "
     "docs/dtypes.md."},
    {"optim.expert_grads", MOE_CFG_ENUM, FIELD(optim.expert_grads), "fp32", 0, 0, 0, moments_names,
     "Storage of the experts' weight gradients: fp32, or bf16 (half their memory and of the "
     "bytes the weight-gradient products write and the gradient norm and AdamW read; each "
     "backward stores the fp32 result rounded to nearest even, a second micro-batch the rounded "
     "sum, as Megatron-Core's bf16 gradient buffers do; data-parallel replicas sum them in "
     "bf16, each addition rounded). Other gradients, master weights and checkpoints stay fp32. "
     "docs/dtypes.md."},
    {"optim.master", MOE_CFG_ENUM, FIELD(optim.master), "fp32", 0, 0, 0, master_names,
     "Storage of the fp32 master weights: fp32, or split (precision.recipe bf16 only): each "
     "weight the products read as its bf16 copy is held as that copy plus its 16 low bits, 4 "
     "bytes with the copy instead of 6 (2 bytes less memory and 2 less written by AdamW per "
     "parameter); norms, embeddings and router gates keep fp32 masters. The masters stay "
     "exact (checkpoints unchanged); the copies round ties away from zero instead of to "
     "even, which changes one value in 131,072. docs/dtypes.md."},

    {"precision.recipe", MOE_CFG_ENUM, FIELD(precision.recipe), "fp32", 0, 0, 0, recipe_names,
     "GEMM numerics: fp32 (CPU reference), bf16, fp8-block, mxfp8 (docs/dtypes.md; mxfp8 also "
     "stores ln1 and the expert activations in MXFP8 and trains with a bf16 residual). The CPU "
     "runs all four (the fp8 ones emulated, slowly), and so does the CUDA backend (mxfp8's "
     "products on sm_90 as bf16 products of the quantized values; on sm_100+ through cuBLASLt's "
     "MXFP8 product, which no GPU of this project's tests has run)."},
    {"precision.fp8_scale", MOE_CFG_ENUM, FIELD(precision.fp8_scale), "default", 0, 0, 0,
     fp8_scale_names,
     "Scale rule of the fp8 recipes: default (fp8-block amax / 448, mxfp8 the E8M0 ceil of "
     "amax / 448: nothing saturates), pow2 (fp8-block, rounded up to a power of two), "
     "ocp-floor (mxfp8, OCP MX's 2^(floor(log2 amax) - 8)). docs/dtypes.md."},
    {"precision.fp8_wgrad", MOE_CFG_ENUM, FIELD(precision.fp8_wgrad), "blocks", 0, 0, 0,
     fp8_wgrad_names,
     "Scales of the activation x in an fp8-block weight gradient dW = dy^T x: blocks (1 x 128 "
     "along the tokens, as dy), or x-tiles (one scale per 128 x 128 tile of tokens and "
     "features: cuBLASLt's faster block x tile product, a coarser x). fp8-block only. "
     "docs/dtypes.md."},
    {"precision.skip_layers", MOE_CFG_STRING, FIELD(precision.skip_layers), "\"\"", 0, 0, 0, NULL,
     "Layers whose products stay bf16 under an fp8 recipe (as BioNeMo keeps the first and "
     "last): comma-separated indices, negative from the end, e.g. \"0,-1\"; empty = none."},

    {"parallel.dp", MOE_CFG_INT, FIELD(parallel.dp), "1", MIN_MAX, 1, 65536, NULL,
     "Data-parallel replicas of each expert group; world = dp x ep ranks, each training "
     "on its own samples."},
    {"parallel.ep", MOE_CFG_INT, FIELD(parallel.ep), "1", MIN_MAX, 1, 65536, NULL,
     "Ranks an expert group spreads the experts over; divides model.num_local_experts."},
    {"parallel.timeout_s", MOE_CFG_FLOAT, FIELD(parallel.timeout_s), "600", MIN_ONLY, 0, 0, NULL,
     "Seconds a rank waits in one collective before it ends the job on every rank (a rank "
     "died or hangs); longer than the slowest checkpoint or evaluation. 0 = wait forever."},

    {"checkpoint.every", MOE_CFG_INT, FIELD(checkpoint.every), "100", MIN_MAX, 0, I64_MAX, NULL,
     "Write a checkpoint every N steps (and always at the end); 0 = only at the end."},
    {"checkpoint.keep", MOE_CFG_INT, FIELD(checkpoint.keep), "3", MIN_MAX, 0, 1000000, NULL,
     "Keep the newest N checkpoints; 0 = keep all."},

    {"log.every", MOE_CFG_INT, FIELD(log.every), "10", MIN_MAX, 1, I64_MAX, NULL,
     "Print a metrics line every N steps."},
    {"log.json", MOE_CFG_STRING, FIELD(log.json), "\"\"", 0, 0, 0, NULL,
     "Also append JSON-lines metrics to this file; empty = none (`--log-json` overrides)."},
};
const int moe_cfg_n_keys = (int)(sizeof moe_cfg_keys / sizeof moe_cfg_keys[0]);

/* ---- enum names ---------------------------------------------------------------------- */

static const char *enum_name(const char *const *names, int n, int v) {
    return v >= 0 && v < n ? names[v] : "?";
}
const char *moe_recipe_name(moe_recipe r) {
    return enum_name(recipe_names, 4, (int)moe_recipe_format(r));
}
const char *moe_device_name(moe_device_kind d) {
    return enum_name(device_names, 3, (int)d);
}
const char *moe_lr_schedule_name(moe_lr_schedule s) {
    return enum_name(schedule_names, 3, (int)s);
}
const char *moe_recompute_name(moe_recompute r) {
    return enum_name(recompute_names, 4, (int)r);
}
const char *moe_moments_name(moe_dtype d) {
    return enum_name(moments_names, 2, (int)d);
}
const char *moe_master_name(moe_master m) {
    return enum_name(master_names, 2, (int)m);
}

/* ---- lookup ---------------------------------------------------------------------------- */

const moe_cfg_key *moe_cfg_find(const char *dotted) {
    for (int i = 0; i < moe_cfg_n_keys; i++)
        if (strcmp(moe_cfg_keys[i].key, dotted) == 0) return &moe_cfg_keys[i];
    return NULL;
}

const char *moe_cfg_leaf(const moe_cfg_key *k) {
    const char *dot = strchr(k->key, '.');
    return dot ? dot + 1 : k->key;
}

int moe_cfg_in_section(const moe_cfg_key *k, const char *section) {
    const char *dot = strchr(k->key, '.');
    size_t n = dot ? (size_t)(dot - k->key) : 0;
    return strlen(section) == n && strncmp(k->key, section, n) == 0;
}

/* ---- formatting ------------------------------------------------------------------------ */

void moe_cfg_format_double(double v, char *buf, size_t n) {
    if (!buf || n == 0) return; /* also tells GCC's -O3 + sanitizer analysis buf is not NULL */
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    /* YAML 1.1 readers (PyYAML) take a float only with a '.': write 1.0e-05, 3.0, not 1e-05, 3 */
    size_t len = strlen(buf);
    if (isfinite(v) && !strchr(buf, '.') && len + 3 <= n) {
        char *e = strchr(buf, 'e');
        size_t at = e ? (size_t)(e - buf) : len;
        memmove(buf + at + 2, buf + at, len - at + 1);
        memcpy(buf + at, ".0", 2);
    }
}

static void format_bound(const moe_cfg_key *k, double v, char *buf, size_t n) {
    if (k->type == MOE_CFG_INT) {
        snprintf(buf, n, "%lld", v >= I64_MAX ? (long long)INT64_MAX : (long long)v);
    } else {
        moe_cfg_format_double(v, buf, n);
    }
}

void moe_cfg_format_allowed(const moe_cfg_key *k, char *buf, size_t n, int markdown) {
    char lo[64], hi[64];
    buf[0] = '\0';
    switch (k->type) {
    case MOE_CFG_ENUM: {
        size_t used = 0;
        for (int i = 0; k->values[i]; i++) {
            int w = snprintf(buf + used, n - used, markdown ? "%s`%s`" : "%s%s", i ? ", " : "",
                             k->values[i]);
            if (w < 0 || (size_t)w >= n - used) break;
            used += (size_t)w;
        }
        return;
    }
    case MOE_CFG_BOOL:
        snprintf(buf, n, "true, false");
        return;
    case MOE_CFG_STRING:
        snprintf(buf, n, "up to %zu bytes", k->size - 1);
        return;
    case MOE_CFG_INT:
    case MOE_CFG_FLOAT:
        break;
    }
    format_bound(k, k->min, lo, sizeof lo);
    format_bound(k, k->max, hi, sizeof hi);
    int has_min = (k->range & MOE_CFG_HAS_MIN) != 0, has_max = (k->range & MOE_CFG_HAS_MAX) != 0;
    int open_lo = (k->range & MOE_CFG_MIN_EXCL) != 0, open_hi = (k->range & MOE_CFG_MAX_EXCL) != 0;
    /* An integer maximum of INT64_MAX is no real limit: show it as a lower bound only. */
    if (k->type == MOE_CFG_INT && k->max >= I64_MAX) has_max = 0;
    if (has_min && has_max) {
        if (k->type == MOE_CFG_INT)
            snprintf(buf, n, "%s .. %s", lo, hi);
        else
            snprintf(buf, n, "%c%s, %s%c", open_lo ? '(' : '[', lo, hi, open_hi ? ')' : ']');
    } else if (has_min) {
        snprintf(buf, n, "%s %s", open_lo ? ">" : ">=", lo);
    } else if (has_max) {
        snprintf(buf, n, "%s %s", open_hi ? "<" : "<=", hi);
    } else {
        snprintf(buf, n, "any");
    }
}

static void format_string(const char *s, char *buf, size_t n) {
    size_t o = 0;
    if (n < 3) {
        if (n) buf[0] = '\0';
        return;
    }
    buf[o++] = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p && o + 6 < n; p++) {
        switch (*p) {
        case '"':
            o += (size_t)snprintf(buf + o, n - o, "\\\"");
            break;
        case '\\':
            o += (size_t)snprintf(buf + o, n - o, "\\\\");
            break;
        case '\n':
            o += (size_t)snprintf(buf + o, n - o, "\\n");
            break;
        case '\t':
            o += (size_t)snprintf(buf + o, n - o, "\\t");
            break;
        default:
            /* \xNN in YAML is the code point U+00NN: for control bytes that is the byte. */
            if (*p < 0x20 || *p == 0x7f)
                o += (size_t)snprintf(buf + o, n - o, "\\x%02x", *p);
            else
                buf[o++] = (char)*p;
        }
    }
    buf[o++] = '"';
    buf[o] = '\0';
}

void moe_cfg_format_value(const moe_cfg_key *k, const moe_config *c, char *buf, size_t n) {
    const char *base = (const char *)c + k->offset;
    switch (k->type) {
    case MOE_CFG_INT: {
        int64_t v;
        memcpy(&v, base, sizeof v);
        snprintf(buf, n, "%lld", (long long)v);
        break;
    }
    case MOE_CFG_FLOAT: {
        double v;
        memcpy(&v, base, sizeof v);
        moe_cfg_format_double(v, buf, n);
        break;
    }
    case MOE_CFG_BOOL: {
        bool v;
        memcpy(&v, base, sizeof v);
        snprintf(buf, n, "%s", v ? "true" : "false");
        break;
    }
    case MOE_CFG_ENUM: {
        int v, count = 0;
        memcpy(&v, base, sizeof v);
        while (k->values[count])
            count++;
        snprintf(buf, n, "%s", enum_name(k->values, count, v));
        break;
    }
    case MOE_CFG_STRING:
        format_string(base, buf, n);
        break;
    }
}

/* ---- parsing and range checks ---------------------------------------------------------- */

static void quote_got(const char *text, size_t len, char *out, size_t n) {
    size_t m = len < 60 ? len : 60;
    snprintf(out, n, "'%.*s'%s", (int)m, text, len > m ? "..." : "");
}

static int parse_int(const char *text, size_t len, int64_t *out) {
    char digits[64];
    size_t o = 0;
    if (len == 0 || len >= sizeof digits) return -1;
    for (size_t i = 0; i < len; i++) {
        char ch = text[i];
        if ((ch == '+' || ch == '-') && i == 0) {
            digits[o++] = ch;
        } else if (isdigit((unsigned char)ch)) {
            digits[o++] = ch;
        } else if (ch == '_' && i > 0 && i + 1 < len && isdigit((unsigned char)text[i - 1]) &&
                   isdigit((unsigned char)text[i + 1])) {
            continue; /* YAML 1.1 digit separator: 16_384 */
        } else {
            return -1;
        }
    }
    digits[o] = '\0';
    if (o == 0 || !isdigit((unsigned char)digits[o - 1])) return -1;
    errno = 0;
    long long v = strtoll(digits, NULL, 10);
    if (errno == ERANGE) return -2;
    *out = (int64_t)v;
    return 0;
}

static int parse_float(const char *text, size_t len, double *out) {
    char tmp[128];
    if (len == 0 || len >= sizeof tmp) return -1;
    memcpy(tmp, text, len);
    tmp[len] = '\0';
    for (size_t i = 0; i < len; i++) /* no hex floats, inf or nan: decimal numbers only */
        if (!strchr("0123456789+-.eE", tmp[i])) return -1;
    char *end;
    errno = 0;
    double v = strtod(tmp, &end);
    if (end != tmp + len) return -1;
    if (errno == ERANGE || !isfinite(v)) return -2;
    *out = v;
    return 0;
}

int moe_cfg_parse_value(const moe_cfg_key *k, moe_config *c, const char *text, size_t len,
                        char *why, size_t why_n) {
    char *base = (char *)c + k->offset;
    char got[80];
    quote_got(text, len, got, sizeof got);
    switch (k->type) {
    case MOE_CFG_INT: {
        int64_t v = 0;
        int r = parse_int(text, len, &v);
        if (r == -2) {
            snprintf(why, why_n, "integer %s does not fit in 64 bits", got);
            return -1;
        }
        if (r) {
            snprintf(why, why_n, "expected an integer, got %s", got);
            return -1;
        }
        memcpy(base, &v, sizeof v);
        return 0;
    }
    case MOE_CFG_FLOAT: {
        double v = 0;
        int r = parse_float(text, len, &v);
        if (r == -2) {
            snprintf(why, why_n, "number %s is out of the range of a double", got);
            return -1;
        }
        if (r) {
            snprintf(why, why_n, "expected a number, got %s", got);
            return -1;
        }
        memcpy(base, &v, sizeof v);
        return 0;
    }
    case MOE_CFG_BOOL: {
        static const char *const yes[] = {"true", "yes", "on"}, *const no[] = {"false", "no",
                                                                               "off"};
        for (int i = 0; i < 3; i++) {
            int t = strlen(yes[i]) == len && strncasecmp(text, yes[i], len) == 0;
            int f = strlen(no[i]) == len && strncasecmp(text, no[i], len) == 0;
            if (t || f) {
                bool v = t;
                memcpy(base, &v, sizeof v);
                return 0;
            }
        }
        snprintf(why, why_n, "expected true or false, got %s", got);
        return -1;
    }
    case MOE_CFG_ENUM: {
        for (int i = 0; k->values[i]; i++) {
            if (strlen(k->values[i]) == len && strncasecmp(text, k->values[i], len) == 0) {
                memcpy(base, &i, sizeof i);
                return 0;
            }
        }
        char allowed[256];
        moe_cfg_format_allowed(k, allowed, sizeof allowed, 0);
        snprintf(why, why_n, "%s is not an allowed value (one of: %s)", got, allowed);
        return -1;
    }
    case MOE_CFG_STRING:
        if (memchr(text, '\0', len)) {
            snprintf(why, why_n, "expected a string without NUL characters");
            return -1;
        }
        if (len >= k->size) {
            snprintf(why, why_n, "string is %zu bytes long, at most %zu allowed", len, k->size - 1);
            return -1;
        }
        memcpy(base, text, len);
        memset(base + len, 0, k->size - len);
        return 0;
    }
    return -1;
}

int moe_cfg_check_range(const moe_cfg_key *k, const moe_config *c, char *why, size_t why_n) {
    const char *base = (const char *)c + k->offset;
    char allowed[256], val[64]; /* formatted only for a value out of range */
    if (k->type == MOE_CFG_ENUM) {
        int v, count = 0;
        memcpy(&v, base, sizeof v);
        while (k->values[count])
            count++;
        if (v >= 0 && v < count) return 0;
        moe_cfg_format_allowed(k, allowed, sizeof allowed, 0);
        snprintf(why, why_n, "holds enum value %d, not one of: %s", v, allowed);
        return -1;
    }
    if (k->type == MOE_CFG_STRING) {
        if (memchr(base, '\0', k->size)) return 0;
        snprintf(why, why_n, "is not NUL-terminated within %zu bytes", k->size);
        return -1;
    }
    if (k->type == MOE_CFG_BOOL) return 0;
    int ok = 1;
    if (k->type == MOE_CFG_INT) {
        int64_t v;
        memcpy(&v, base, sizeof v);
        /* Bounds are integers held exactly in a double; INT64_MAX maps to 2^63. */
        if ((k->range & MOE_CFG_HAS_MIN) && (double)v < k->min) ok = 0;
        if ((k->range & MOE_CFG_HAS_MAX) && k->max < I64_MAX && (double)v > k->max) ok = 0;
        if (ok) return 0;
        snprintf(val, sizeof val, "%lld", (long long)v);
    } else {
        double v;
        memcpy(&v, base, sizeof v);
        if (!isfinite(v)) ok = 0;
        if (k->range & MOE_CFG_HAS_MIN)
            ok &= (k->range & MOE_CFG_MIN_EXCL) ? v > k->min : v >= k->min;
        if (k->range & MOE_CFG_HAS_MAX)
            ok &= (k->range & MOE_CFG_MAX_EXCL) ? v < k->max : v <= k->max;
        if (ok) return 0;
        moe_cfg_format_double(v, val, sizeof val);
    }
    moe_cfg_format_allowed(k, allowed, sizeof allowed, 0);
    int both = (k->range & MOE_CFG_HAS_MIN) && (k->range & MOE_CFG_HAS_MAX) &&
               !(k->type == MOE_CFG_INT && k->max >= I64_MAX);
    snprintf(why, why_n, "%s is out of range: must be %s%s", val, both ? "in " : "", allowed);
    return -1;
}

/* ---- defaults -------------------------------------------------------------------------- */

void moe_config_defaults(moe_config *c) {
    char why[256];
    memset(c, 0, sizeof *c);
    /* Every default parses and is in range: unit.config checks each row. */
    for (int i = 0; i < moe_cfg_n_keys; i++) {
        const moe_cfg_key *k = &moe_cfg_keys[i];
        const char *d = k->def;
        size_t len = strlen(d);
        if (k->type == MOE_CFG_STRING && len >= 2 && d[0] == '"') { /* "" in the table */
            d++;
            len -= 2;
        }
        (void)moe_cfg_parse_value(k, c, d, len, why, sizeof why);
    }
}

/* ---- YAML output ----------------------------------------------------------------------- */

moe_status moe_config_write_yaml(const moe_config *c, FILE *fp, moe_err *err) {
    char val[2 * sizeof c->data.path + 16];
    fprintf(fp,
            "# moe-genomics configuration, every key resolved (moe-genomics %s).\n"
            "# Keys and their meaning: docs/config.md.\n",
            MOE_VERSION);
    for (int s = 0; s < moe_cfg_n_sections; s++) {
        const char *sec = moe_cfg_sections[s].name;
        const char *indent = sec[0] ? "  " : "";
        fprintf(fp, "\n");
        if (sec[0]) fprintf(fp, "%s:\n", sec);
        for (int i = 0; i < moe_cfg_n_keys; i++) {
            const moe_cfg_key *k = &moe_cfg_keys[i];
            if (!moe_cfg_in_section(k, sec)) continue;
            moe_cfg_format_value(k, c, val, sizeof val);
            fprintf(fp, "%s# %s\n%s%s: %s\n", indent, k->doc, indent, moe_cfg_leaf(k), val);
        }
    }
    if (fflush(fp) != 0 || ferror(fp))
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "writing the configuration YAML failed");
    return MOE_OK;
}

/* ---- docs/config.md -------------------------------------------------------------------- */

static const char *type_name(const moe_cfg_key *k) {
    switch (k->type) {
    case MOE_CFG_INT:
        return "int";
    case MOE_CFG_FLOAT:
        return "float";
    case MOE_CFG_BOOL:
        return "bool";
    case MOE_CFG_STRING:
        return "string";
    case MOE_CFG_ENUM:
        return "enum";
    }
    return "?";
}

void moe_config_write_markdown(FILE *fp) {
    fputs("<!-- Generated by moe_config_write_markdown() from the schema table in "
          "libcore/src/io/config_schema.c.\n     Do not edit by hand: see \"Regenerating this "
          "page\" at the end. -->\n"
          "# Configuration reference\n\n"
          "`moe-train -c CONFIG.yaml` reads a YAML file with the sections below (every key is "
          "optional; a missing key keeps its default). The defaults describe a small model "
          "that trains on a CPU in about a minute; the files in `configs/` set the rest "
          "(`tiny.yaml`, `L0_sanity.yaml`, `og2_8x1b.yaml`, `mixtral_8x7b.yaml`). Model keys "
          "are the Hugging Face `MixtralConfig` names, so `config.json` export is a copy.\n\n"
          "A configuration is resolved in this order:\n\n"
          "1. the defaults listed here;\n"
          "2. the YAML file (`-c`);\n"
          "3. `section.key=value` overrides from the command line, in order (a later one "
          "wins; surrounding quotes of the value are removed);\n"
          "4. validation: each key's type and range, then the cross-field rules below.\n\n"
          "Every error is reported with the file, line and column it came from, e.g.\n\n"
          "```\n"
          "moe-train: error: run.yaml:7:3: unknown key `model.num_layers`\n"
          "hint: did you mean `model.num_hidden_layers`? (docs/config.md lists every key)\n"
          "```\n\n"
          "The resolved configuration is written to each checkpoint as `config.yaml` (every "
          "key, with its description as a comment); it loads back to identical values, and "
          "`moe-train --dry-run` prints it.\n\n"
          "## Example\n\n"
          "```yaml\n"
          "device: cpu\n"
          "model:\n"
          "  hidden_size: 64\n"
          "  num_hidden_layers: 2\n"
          "train:\n"
          "  steps: 200\n"
          "  seq_len: 256\n"
          "  global_batch_tokens: 4096\n"
          "optim:\n"
          "  lr: 3.0e-3\n"
          "precision:\n"
          "  recipe: fp32\n"
          "```\n\n"
          "Overrides use the same dotted names:\n\n"
          "```sh\n"
          "moe-train -c configs/tiny.yaml -o run/ train.steps=100 model.num_hidden_layers=4 \\\n"
          "    precision.recipe=bf16 data.path=shards/\n"
          "```\n\n"
          "Value syntax: integers are whole numbers (`16_384` is accepted), floats are decimal "
          "(`3e-4`, `0.1`; no `inf`/`nan`), booleans are `true`/`false` (also `yes`/`no`, "
          "`on`/`off`), enums are one of the listed names (case-insensitive), strings may be "
          "quoted; `~` or nothing means the empty string.\n",
          fp);
    char allowed[256], def[128];
    for (int s = 0; s < moe_cfg_n_sections; s++) {
        const char *sec = moe_cfg_sections[s].name;
        if (sec[0])
            fprintf(fp, "\n## `%s`\n\n%s\n\n", sec, moe_cfg_sections[s].doc);
        else
            fprintf(fp, "\n## Top level\n\n%s\n\n", moe_cfg_sections[s].doc);
        fputs("| key | type | default | allowed | description |\n"
              "|---|---|---|---|---|\n",
              fp);
        for (int i = 0; i < moe_cfg_n_keys; i++) {
            const moe_cfg_key *k = &moe_cfg_keys[i];
            if (!moe_cfg_in_section(k, sec)) continue;
            moe_cfg_format_allowed(k, allowed, sizeof allowed, 1);
            snprintf(def, sizeof def, "%s", k->def);
            fprintf(fp, "| `%s` | %s | `%s` | %s | %s |\n", k->key, type_name(k), def, allowed,
                    k->doc);
        }
    }
    fputs("\n## Cross-field rules\n\n"
          "Checked after the last override; the error names the keys and points at the line "
          "of the file that set one of them.\n\n"
          "- `model.hidden_size` is divisible by `model.num_attention_heads`, and the head "
          "dimension (their quotient) is even (RoPE rotates pairs).\n"
          "- `model.num_attention_heads` is divisible by `model.num_key_value_heads`.\n"
          "- `model.num_experts_per_tok` <= `model.num_local_experts`.\n"
          "- `train.seq_len` <= `model.max_position_embeddings`.\n"
          "- `train.global_batch_tokens` is a multiple of `train.seq_len` x `parallel.dp` x "
          "`parallel.ep` (every rank trains on its own whole samples).\n"
          "- `train.micro_batch_tokens`, when not 0, is a multiple of `train.seq_len` and "
          "divides `train.global_batch_tokens`; the number of micro-batches per step, global / "
          "micro, is a multiple of `parallel.dp` x `parallel.ep` (each rank runs its share).\n"
          "- `train.eval_tokens` is a multiple of `train.seq_len`.\n"
          "- `optim.min_lr` <= `optim.lr`; `optim.warmup_steps` <= `train.steps`.\n"
          "- `optim.moments: bf16` needs `optim.beta1` and `optim.beta2` <= 0.99: bf16 keeps 8 "
          "significant bits, so a step changes a stored moment only by more than half a bf16 "
          "ulp (2^-9 to 2^-8 of its value); with a decay 1 - beta below that, beta x m rounds "
          "back to m and the moment never decays. 0.99 (a decay of 0.01, above 2^-8) keeps a "
          "margin ([dtypes.md](dtypes.md)).\n"
          "- `optim.master: split` needs `precision.recipe: bf16`: a split master is a weight's "
          "bf16 copy plus 16 low bits, and only bf16 keeps bf16 copies (fp8-block and mxfp8 "
          "keep e4m3 ones or none).\n"
          "- `parallel.ep` divides `model.num_local_experts`.\n"
          "\n## Regenerating this page\n\n"
          "This page is generated from the schema table; `unit.config` fails when it is stale. "
          "After changing a key, rebuild and run the test binary with `MOE_REGEN_DOCS=1`:\n\n"
          "```sh\n"
          "cmake -S . -B build -G Ninja && ninja -C build unit_test_config\n"
          "MOE_REGEN_DOCS=1 MOE_SRC_DIR=$PWD build/tests/unit_test_config\n"
          "```\n\n"
          "`MOE_SRC_DIR` is the checkout whose `docs/config.md` is rewritten (the current "
          "directory when unset); the test then compares against the new file and passes.\n",
          fp);
}
