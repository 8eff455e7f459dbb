/* test_convert: the pieces of moe-convert that need no files - the Mixtral tensor table
 * (it must name and shape exactly the tensors of the model's parameter table, tied and
 * untied, or exports would miss or invent tensors) and --max-shard-size parsing. The file
 * conversions themselves are tested end to end in tests/e2e/convert_roundtrip.sh. */
#include <stdlib.h>
#include <string.h>

#include "moe/convert.h"
#include "moe/model.h"
#include "testlib.h"

static void check_table(int tied) {
    moe_config cfg;
    moe_config_defaults(&cfg);
    moe_model_config *c = &cfg.model;
    c->vocab_size = 24;
    c->hidden_size = 16;
    c->intermediate_size = 12;
    c->num_hidden_layers = 3;
    c->num_attention_heads = 4;
    c->num_key_value_heads = 2;
    c->num_local_experts = 3;
    c->num_experts_per_tok = 2;
    c->max_position_embeddings = 8;
    c->tie_word_embeddings = tied;
    moe_err err;
    moe_err_clear(&err);
    moe_model m;
    memset(&m, 0, sizeof m);
    CHECK_INT_EQ(moe_model_create(&m, c, MOE_RECIPE_FP32, MOE_RECOMPUTE_NONE,
                                  moe_backend_cpu(), 1, 4, &err), MOE_OK);
    moe_convert_tensor *tab;
    int n = moe_convert_tensor_table(c, &tab);
    CHECK_INT_EQ(n, m.n_params);
    int64_t numel = 0;
    for (int i = 0; i < n && i < m.n_params; i++) {
        int j = moe_model_find_param(&m, tab[i].name);
        CHECK_MSG(j >= 0, "table tensor %s is not a model parameter", tab[i].name);
        if (j < 0) continue;
        CHECK_INT_EQ(tab[i].ndim, m.params[j].ndim);
        CHECK_INT_EQ(tab[i].shape[0], m.params[j].shape[0]);
        if (tab[i].ndim == 2) CHECK_INT_EQ(tab[i].shape[1], m.params[j].shape[1]);
        numel += tab[i].shape[0] * (tab[i].ndim == 2 ? tab[i].shape[1] : 1);
        if (tab[i].kind != MOE_CT_OTHER) {
            CHECK_INT_EQ(tab[i].expert, m.params[j].expert);
            CHECK_INT_EQ(tab[i].layer, m.params[j].layer);
        }
    }
    CHECK_INT_EQ(numel, moe_model_n_params(&m));
    CHECK_INT_EQ(moe_model_find_param(&m, "lm_head.weight") >= 0, !tied);
    free(tab);
    moe_model_free(&m);
}

int main(void) {
    check_table(0);
    check_table(1);
    CHECK_INT_EQ(moe_convert_parse_size("5GB"), 5000000000LL);
    CHECK_INT_EQ(moe_convert_parse_size("500MB"), 500000000LL);
    CHECK_INT_EQ(moe_convert_parse_size("20KB"), 20000);
    CHECK_INT_EQ(moe_convert_parse_size("2GiB"), 2147483648LL);
    CHECK_INT_EQ(moe_convert_parse_size("1.5MB"), 1500000);
    CHECK_INT_EQ(moe_convert_parse_size("12345"), 12345);
    CHECK_INT_EQ(moe_convert_parse_size("5 GB"), -1);
    CHECK_INT_EQ(moe_convert_parse_size("GB"), -1);
    CHECK_INT_EQ(moe_convert_parse_size("-3MB"), -1);
    CHECK_INT_EQ(moe_convert_parse_size("0"), -1);
    return test_summary("convert");
}
