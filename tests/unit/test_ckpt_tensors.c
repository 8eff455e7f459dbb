/* test_ckpt_tensors: the tensor part of moe_ckpt_open (moe/ckpt.h) on synthetic
 * checkpoints of a 1-layer, 4-expert model (config.yaml, a nuc tokenizer.json and tensors of
 * the parameter table). The same values read back from the single-file layout and from ep 2 and
 * ep 4 (experts by global index, dense tensors on rank 0); the damage that only a hand-made
 * file shows is refused naming the file and the tensor: a dense tensor also in rank 1's
 * file, a BF16 weight, a missing moment, an index total_size that does not add up, an index
 * naming a tensor the model lacks, a file missing from MANIFEST, config parallel.ep that
 * disagrees with the files, optimizer files for some ranks only. A weights-only checkpoint
 * (no optimizer file) reads its moments as zeros. (tests/e2e/convert_reshard.sh covers the
 * tools.) */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe/ckpt.h"
#include "moe/fileio.h"
#include "moe/model_params.h"
#include "testlib.h"

enum { OK = 0, STRAY, BF16, NO_MOMENT, BAD_TOTAL, EXTRA_NAME, UNLISTED, WEIGHTS_ONLY, HALF_OPTIM };

static void small_config(moe_config *c, int ep) {
    moe_config_defaults(c);
    moe_model_config *m = &c->model;
    m->vocab_size = 40;
    m->hidden_size = 4;
    m->intermediate_size = 6;
    m->num_hidden_layers = 1;
    m->num_attention_heads = 2;
    m->num_key_value_heads = 1;
    m->num_local_experts = 4;
    m->num_experts_per_tok = 2;
    m->tie_word_embeddings = 0;
    c->parallel.ep = ep;
}

/* Value of element k of parameter i, slot s (0 weight, 1 exp_avg, 2 exp_avg_sq). */
static float value(int i, int s, int64_t k) {
    return (float)(i + 1) * (s == 0 ? 1.0f : s == 1 ? -1.0f : 0.5f) + (float)k * 1e-3f;
}

/* config.yaml (c), a nuc tokenizer.json and a trainer_state.json into dir. */
static int write_meta(const char *dir, const moe_config *c) {
    moe_err err;
    moe_err_clear(&err);
    char path[512];
    snprintf(path, sizeof path, "%s/config.yaml", dir);
    FILE *fp = fopen(path, "w");
    int ok = fp && moe_config_write_yaml(c, fp, &err) == MOE_OK;
    if (fp) ok = fclose(fp) == 0 && ok;
    moe_tokenizer_opts o;
    moe_tokenizer_opts_defaults(&o, MOE_TOKENIZER_NUC);
    moe_tokenizer *tok = NULL;
    ok = ok && moe_tokenizer_create(&tok, &o, &err) == MOE_OK;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    ok = ok && moe_write_text_file(path, moe_tokenizer_spec_json(tok), NULL, &err) == MOE_OK;
    moe_tokenizer_free(tok);
    snprintf(path, sizeof path, "%s/trainer_state.json", dir); /* listed by every checkpoint */
    ok = ok && moe_write_text_file(path, "{}\n", NULL, &err) == MOE_OK;
    return ok;
}

/* Writes checkpoint directory dir in the ep layout with one kind of damage. */
static int write_ckpt(const char *dir, const moe_config *c, int ep, int damage) {
    moe_err err;
    moe_err_clear(&err);
    moe_remove_tree(dir, &err);
    if (moe_mkdirs(dir, &err) != MOE_OK) return 0;
    moe_param_table table;
    if (moe_param_table_build(&table, &c->model, 0, c->model.num_local_experts, &err) != MOE_OK)
        return 0;
    const moe_param *tab = table.params;
    int n = table.n_params;
    float **data = calloc((size_t)n, sizeof *data);
    for (int i = 0; i < n; i++) {
        int64_t numel = tab[i].numel;
        data[i] = malloc((size_t)numel * 3 * sizeof(float));
        for (int s = 0; s < 3; s++)
            for (int64_t k = 0; k < numel; k++)
                data[i][s * numel + k] = value(i, s, k);
    }
    int ok = 1;
    int64_t total = 0;
    json_t *map = json_object();
    for (int r = 0; r < ep && ok; r++) {
        moe_st_writer w, o;
        moe_st_writer_init(&w);
        moe_st_writer_init(&o);
        moe_st_writer_meta(&w, "format", "pt", &err);
        for (int i = 0; i < n; i++) {
            int rank = moe_param_rank(&tab[i], c->model.num_local_experts, ep);
            int stray = damage == STRAY && r == 1 && strcmp(tab[i].name, "model.norm.weight") == 0;
            if (rank != r && !stray) continue;
            int64_t numel = tab[i].numel;
            moe_st_dtype dt = damage == BF16 && tab[i].expert == 3 && tab[i].kind == MOE_PARAM_W2
                                  ? MOE_ST_BF16
                                  : MOE_ST_F32;
            moe_st_writer_add_f32(&w, tab[i].name, dt, tab[i].ndim, tab[i].shape, data[i], &err);
            if (stray) continue;
            char name[200], file[64];
            moe_ckpt_model_file(r, ep, file, sizeof file);
            json_object_set_new(map, tab[i].name, json_string(file));
            total += numel * 4;
            snprintf(name, sizeof name, "%s.exp_avg", tab[i].name);
            moe_st_writer_add(&o, name, MOE_ST_F32, tab[i].ndim, tab[i].shape, data[i] + numel,
                              &err);
            snprintf(name, sizeof name, "%s.exp_avg_sq", tab[i].name);
            if (!(damage == NO_MOMENT && i == n - 1))
                moe_st_writer_add(&o, name, MOE_ST_F32, tab[i].ndim, tab[i].shape,
                                  data[i] + 2 * numel, &err);
        }
        char file[64], path[512];
        moe_ckpt_model_file(r, ep, file, sizeof file);
        snprintf(path, sizeof path, "%s/%s", dir, file);
        ok = moe_st_writer_write(&w, path, &err) == MOE_OK;
        moe_ckpt_optim_file(r, file, sizeof file);
        snprintf(path, sizeof path, "%s/%s", dir, file);
        if (damage != WEIGHTS_ONLY && !(damage == HALF_OPTIM && r == 1))
            ok = ok && moe_st_writer_write(&o, path, &err) == MOE_OK;
        moe_st_writer_free(&w);
        moe_st_writer_free(&o);
    }
    if (ok && ep > 1) {
        json_t *idx = json_object(), *meta = json_object();
        if (damage == EXTRA_NAME)
            json_object_set_new(map, "model.layers.0.block_sparse_moe.experts.9.w1.weight",
                                json_string("model-ep00000-of-00002.safetensors"));
        json_object_set_new(meta, "total_size", json_integer(total + (damage == BAD_TOTAL)));
        json_object_set_new(meta, "moe_ep", json_integer(ep));
        json_object_set_new(idx, "metadata", meta);
        json_object_set_new(idx, "weight_map", map);
        map = NULL;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, MOE_CKPT_INDEX_FILE);
        ok = json_dump_file(idx, path, JSON_SORT_KEYS) == 0;
        json_decref(idx);
    }
    json_decref(map);
    ok = ok && write_meta(dir, c);
    ok = ok && moe_ckpt_write_manifest(dir, &err) == MOE_OK;
    if (ok && damage == UNLISTED) { /* rank 1's model file missing from MANIFEST */
        char path[512];
        snprintf(path, sizeof path, "%s/MANIFEST", dir);
        char *man;
        size_t mlen;
        if (moe_read_file(path, &man, &mlen, &err) == MOE_OK) { /* drop rank 1's line */
            char *line = strstr(man, "model-ep00001");
            char *start = line;
            while (start > man && start[-1] != '\n')
                start--;
            char *end = strchr(line, '\n');
            memmove(start, end + 1, strlen(end + 1) + 1);
            if (man[0] == '#') /* and its first line, or it would not match the lines below */
                memmove(man, strchr(man, '\n') + 1, strlen(strchr(man, '\n') + 1) + 1);
            moe_write_text_file(path, man, NULL, &err);
            free(man);
        }
    }
    for (int i = 0; i < n; i++)
        free(data[i]);
    free(data);
    moe_param_table_free(&table);
    return ok;
}

/* Rewrites dir's config.yaml as c (and its MANIFEST, so that only the layout disagrees). */
static int with_config(const char *dir, const moe_config *c) {
    moe_err err;
    moe_err_clear(&err);
    return write_meta(dir, c) && moe_ckpt_write_manifest(dir, &err) == MOE_OK;
}

/* Opens dir and checks every value of every parameter; returns the open status. */
static moe_status open_and_check(const char *dir, int ep, moe_err *err) {
    moe_ckpt ct;
    moe_status st = moe_ckpt_open(&ct, dir, MOE_CKPT_OPTIMIZER, err);
    if (st != MOE_OK) return st;
    CHECK_INT_EQ(ct.ep, ep);
    for (int i = 0; i < ct.table.n_params; i++) {
        const moe_ckpt_tensor *t = &ct.t[i];
        CHECK(moe_ckpt_find(&ct, t->p->name) == t);
        CHECK_INT_EQ(t->rank, t->p->expert < 0 ? 0 : t->p->expert / (4 / ep));
        int64_t numel = t->p->numel;
        float *buf = malloc((size_t)numel * sizeof(float));
        for (int s = 0; s < 3; s++) {
            CHECK(moe_ckpt_read_tensor(&ct, t->p->name, (moe_ckpt_slot)s, t->p->ndim, t->p->shape,
                                       buf, err) == MOE_OK);
            int same = 1;
            for (int64_t k = 0; k < numel; k++)
                same &= buf[k] == value(i, s, k);
            CHECK_MSG(same, "%s slot %d: values differ", t->p->name, s);
        }
        free(buf);
    }
    CHECK(moe_ckpt_find(&ct, "model.layers.0.block_sparse_moe.experts.4.w1.weight") == NULL);
    int64_t wrong[2] = {3, 3};
    float tmp[9];
    CHECK(moe_ckpt_read_tensor(&ct, "model.norm.weight", MOE_CKPT_WEIGHT, 2, wrong, tmp, err) ==
          MOE_ERR_INPUT);
    moe_err_clear(err);
    moe_ckpt_close(&ct);
    return MOE_OK;
}

/* A weights-only checkpoint: weights as written, both moments zero. */
static void check_weights_only(const char *dir, const moe_config *c, int ep) {
    moe_err err;
    moe_err_clear(&err);
    CHECK(write_ckpt(dir, c, ep, WEIGHTS_ONLY));
    moe_ckpt ct;
    CHECK_MSG(moe_ckpt_open(&ct, dir, MOE_CKPT_OPTIMIZER, &err) == MOE_OK, "%s", err.msg);
    if (err.status != MOE_OK) return;
    CHECK_INT_EQ(ct.weights_only, 1);
    for (int i = 0; i < ct.table.n_params; i++) {
        const moe_ckpt_tensor *t = &ct.t[i];
        int64_t numel = t->p->numel;
        float *buf = malloc((size_t)numel * sizeof(float));
        for (int s = 0; s < 3; s++) {
            for (int64_t k = 0; k < numel; k++)
                buf[k] = 7.0f;
            CHECK(moe_ckpt_read_tensor(&ct, t->p->name, (moe_ckpt_slot)s, t->p->ndim, t->p->shape,
                                       buf, &err) == MOE_OK);
            int same = 1;
            for (int64_t k = 0; k < numel; k++)
                same &= buf[k] == (s == 0 ? value(i, 0, k) : 0.0f);
            CHECK_MSG(same, "weights-only %s slot %d: values differ", t->p->name, s);
        }
        free(buf);
    }
    moe_ckpt_close(&ct);
}

static void expect_error(const char *dir, const moe_config *c, int ep, int damage,
                         const char *want) {
    moe_err err;
    moe_err_clear(&err);
    CHECK(write_ckpt(dir, c, ep, damage));
    moe_ckpt ct;
    moe_status st = moe_ckpt_open(&ct, dir, MOE_CKPT_OPTIMIZER, &err);
    CHECK_MSG(st == MOE_ERR_INPUT, "damage %d: status %d", damage, (int)st);
    CHECK_MSG(strstr(err.msg, want) != NULL, "damage %d: '%s' lacks '%s'", damage, err.msg, want);
    CHECK_MSG(err.file[0] != '\0', "damage %d: no file named", damage);
    if (st == MOE_OK) moe_ckpt_close(&ct);
}

int main(void) {
    moe_config c1, c2, c4;
    small_config(&c1, 1);
    small_config(&c2, 2);
    small_config(&c4, 4);
    moe_err err;
    moe_err_clear(&err);

    char name[64];
    moe_ckpt_model_file(1, 4, name, sizeof name);
    CHECK(strcmp(name, "model-ep00001-of-00004.safetensors") == 0);
    moe_ckpt_model_file(0, 1, name, sizeof name);
    CHECK(strcmp(name, "model.safetensors") == 0);
    moe_ckpt_optim_file(3, name, sizeof name);
    CHECK(strcmp(name, "optimizer-rank3.safetensors") == 0);
    moe_param dense = {.expert = -1}, e5 = {.expert = 5};
    CHECK_INT_EQ(moe_param_rank(&dense, 8, 4), 0);
    CHECK_INT_EQ(moe_param_rank(&e5, 8, 4), 2); /* experts 4-5 on rank 2 */
    CHECK_INT_EQ(moe_param_rank(&e5, 8, 1), 0);

    /* the same values whatever the layout */
    CHECK(write_ckpt("ckt1", &c1, 1, OK));
    CHECK(open_and_check("ckt1", 1, &err) == MOE_OK);
    CHECK(write_ckpt("ckt2", &c2, 2, OK));
    CHECK(open_and_check("ckt2", 2, &err) == MOE_OK);
    CHECK(write_ckpt("ckt4", &c4, 4, OK));
    CHECK_MSG(open_and_check("ckt4", 4, &err) == MOE_OK, "%s", err.msg);

    /* config.yaml's parallel.ep and the files must agree */
    moe_ckpt ct;
    moe_err_clear(&err);
    CHECK(with_config("ckt2", &c4));
    CHECK(moe_ckpt_open(&ct, "ckt2", 0, &err) == MOE_ERR_INPUT);
    CHECK(strstr(err.msg, "laid out for ep=2") != NULL);
    moe_err_clear(&err);
    CHECK(with_config("ckt1", &c2));
    CHECK(moe_ckpt_open(&ct, "ckt1", 0, &err) == MOE_ERR_INPUT);
    CHECK(strstr(err.msg, "parallel.ep=2") != NULL);

    expect_error("bad", &c2, 2, STRAY, "belongs to EP rank 0's file, not rank 1's");
    expect_error("bad", &c2, 2, BF16, "is BF16");
    expect_error("bad", &c1, 1, BF16, "is BF16");
    expect_error("bad", &c2, 2, NO_MOMENT, ".exp_avg_sq' is missing");
    expect_error("bad", &c2, 2, BAD_TOTAL, "total_size");
    expect_error("bad", &c2, 2, EXTRA_NAME, "experts.9.w1.weight', which is not a parameter");
    expect_error("bad", &c2, 2, UNLISTED, "not listed in the checkpoint's MANIFEST");
    expect_error("bad", &c2, 2, HALF_OPTIM, "optimizer-rank1.safetensors");
    check_weights_only("bad", &c1, 1);
    check_weights_only("bad", &c4, 4);

    const char *dirs[] = {"ckt1", "ckt2", "ckt4", "bad"};
    for (int i = 0; i < 4; i++)
        moe_remove_tree(dirs[i], &err);
    return test_summary("ckpt_tensors");
}
