/* convert_reshard: moe-convert reshard --ep N and consolidate (= reshard to ep 1) - a
 * checkpoint rewritten in another expert-parallel layout (moe/ckpt.h).
 *
 * Input: any checkpoint (either layout), opened with moe_ckpt_open (MANIFEST verified, every
 * tensor of the parameter table indexed). Output: a new complete checkpoint directory, written into
 * OUT.tmp.<pid>/ (model files, optimizer files, the index when ep > 1, config.yaml with parallel.ep
 * = N, every other file - tokenizer.json, trainer_state.json, ... - copied byte for byte), each
 * file fsynced, MANIFEST last, then renamed to OUT and the parent fsynced. The one thing to know:
 * tensor bytes are handed from the input's mmap straight to the safetensors writer with
 * their dtype, shape and the input's __metadata__, never converted, so reshard then
 * consolidate gives back every file of the original byte for byte. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moe/ckpt.h"
#include "moe/convert.h"
#include "moe/fileio.h"
#include "moe/log.h"

/* The rewritten config: parallel.ep = ep, then the overrides, then validation. */
static moe_status out_config(const moe_config *ck, const char *cfg_path, int ep, int n_overrides,
                             char *const *overrides, moe_config *out, moe_err *err) {
    if (ep < 1 || ck->model.num_local_experts % ep) {
        char divisors[256] = "";
        for (int64_t d = 1; d <= ck->model.num_local_experts; d++) {
            if (ck->model.num_local_experts % d) continue;
            size_t len = strlen(divisors);
            snprintf(divisors + len, sizeof divisors - len, "%s%" PRId64, len ? ", " : "", d);
        }
        moe_err_set(err, MOE_ERR_INPUT, cfg_path,
                    "--ep %d does not divide model.num_local_experts (%" PRId64
                    "): experts are split evenly over the EP ranks",
                    ep, ck->model.num_local_experts);
        moe_err_hint(err, "choose --ep from %s", divisors);
        return MOE_ERR_INPUT;
    }
    *out = *ck;
    out->parallel.ep = ep;
    for (int i = 0; i < n_overrides; i++) {
        char key[128];
        const char *eq = strchr(overrides[i], '=');
        size_t klen = eq ? (size_t)(eq - overrides[i]) : 0;
        if (!eq || klen == 0 || klen >= sizeof key) {
            moe_err_set(err, MOE_ERR_INPUT, NULL, "expected a config override KEY=VALUE, got '%s'",
                        overrides[i]);
            moe_err_hint(err, "e.g. train.global_batch_tokens=4096 (keys: docs/config.md)");
            return MOE_ERR_INPUT;
        }
        memcpy(key, overrides[i], klen);
        key[klen] = '\0';
        if (strncmp(key, "model.", 6) == 0 || strcmp(key, "parallel.ep") == 0) {
            moe_err_set(err, MOE_ERR_INPUT, NULL,
                        "override '%s': reshard cannot change %s (the tensors fix the model; "
                        "--ep sets parallel.ep)",
                        overrides[i], key);
            return MOE_ERR_INPUT;
        }
        moe_status st = moe_config_set(out, key, eq + 1, err);
        if (st != MOE_OK) return st;
    }
    moe_err verr;
    moe_err_clear(&verr);
    if (moe_config_validate(out, &verr) == MOE_OK) return MOE_OK;
    moe_err_set(err, MOE_ERR_INPUT, cfg_path, "with parallel.ep=%d the config would be invalid: %s",
                ep, verr.msg);
    moe_err_hint(err,
                 "%s%sgive the change as KEY=VALUE after OUT_DIR (moe-convert reshard --ep %d "
                 "CKPT OUT KEY=VALUE); it only changes the stored config.yaml",
                 verr.hint, verr.hint[0] ? "; " : "", ep);
    return MOE_ERR_INPUT;
}

/* Copies every __metadata__ entry of f into w. */
static moe_status copy_meta(moe_st_writer *w, const moe_st_file *f, moe_err *err) {
    moe_status st = MOE_OK;
    for (int i = 0; st == MOE_OK && i < f->n_meta; i++)
        st = moe_st_writer_meta(w, f->meta_keys[i], f->meta_values[i], err);
    return st;
}

static moe_status add_copy(moe_st_writer *w, const moe_st_tensor *t, moe_err *err) {
    return moe_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, err);
}

/* Writes rank r's model file and optimizer file (none for a weights-only input) into tmp. */
static moe_status write_rank(const moe_ckpt *in, int r, int ep, int64_t E, const char *tmp,
                             moe_err *err) {
    moe_status st = MOE_OK;
    for (int pass = 0; st == MOE_OK && pass < (in->weights_only ? 1 : 2); pass++) {
        moe_st_writer w;
        moe_st_writer_init(&w);
        st = copy_meta(&w, pass == 0 ? &in->model[0] : &in->optim[0], err);
        for (int i = 0; st == MOE_OK && i < in->table.n_params; i++) {
            const moe_ckpt_tensor *t = &in->t[i];
            if (moe_param_rank(t->p, E, ep) != r) continue;
            if (pass == 0) {
                st = add_copy(&w, t->w, err);
            } else {
                st = add_copy(&w, t->exp_avg, err);
                if (st == MOE_OK) st = add_copy(&w, t->exp_avg_sq, err);
            }
        }
        char name[64], path[MOE_CKPT_PATH_MAX + 64];
        if (pass == 0)
            moe_ckpt_model_file(r, ep, name, sizeof name);
        else
            moe_ckpt_optim_file(r, name, sizeof name);
        if (snprintf(path, sizeof path, "%s/%s", tmp, name) >= (int)sizeof path)
            st = moe_err_set(err, MOE_ERR_INPUT, tmp, "path too long");
        if (st == MOE_OK) st = moe_st_writer_write(&w, path, err);
        moe_st_writer_free(&w);
    }
    return st;
}

/* A file of the old layout that the new one replaces (not copied). */
static int is_layout_file(const char *name) {
    size_t len = strlen(name);
    int st = len > 12 && strcmp(name + len - 12, ".safetensors") == 0;
    return strcmp(name, "config.yaml") == 0 || strcmp(name, MOE_CKPT_INDEX_FILE) == 0 ||
           (st && (strncmp(name, "model", 5) == 0 || strncmp(name, "optimizer-rank", 14) == 0));
}

/* Copies every other file MANIFEST lists (tokenizer.json, trainer_state.json, ...) verbatim. */
static moe_status copy_other_files(const moe_ckpt *in, const char *tmp, moe_err *err) {
    const char *dir = in->dir;
    moe_status st = MOE_OK;
    for (int i = 0; st == MOE_OK && i < in->n_files; i++) {
        const char *name = in->files[i].name;
        if (is_layout_file(name)) continue;
        char src[MOE_CKPT_PATH_MAX], dst[MOE_CKPT_PATH_MAX];
        if (snprintf(src, sizeof src, "%s/%s", dir, name) >= (int)sizeof src ||
            snprintf(dst, sizeof dst, "%s/%s", tmp, name) >= (int)sizeof dst) {
            st = moe_err_set(err, MOE_ERR_INPUT, dir, "path too long");
            break;
        }
        char *data;
        size_t len;
        st = moe_read_file(src, &data, &len, err);
        if (st != MOE_OK) break;
        moe_outfile out;
        st = moe_outfile_open(&out, dst, err);
        if (st == MOE_OK) {
            st = moe_outfile_write(&out, data, len, err);
            if (st == MOE_OK)
                st = moe_outfile_commit(&out, err);
            else
                moe_outfile_abort(&out);
        }
        free(data);
    }
    return st;
}

static moe_status write_config(const moe_config *cfg, const char *tmp, moe_err *err) {
    char path[MOE_CKPT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/config.yaml", tmp);
    moe_outfile out;
    moe_status st = moe_outfile_open(&out, path, err);
    if (st != MOE_OK) return st;
    st = moe_config_write_yaml(cfg, out.fp, err);
    if (st == MOE_OK) return moe_outfile_commit(&out, err);
    moe_outfile_abort(&out);
    return st;
}

/* Renames the finished tmp to out and makes it durable (fsync of the parent directory). */
static moe_status publish(const char *tmp, const char *out, moe_err *err) {
    moe_status st = moe_ckpt_write_manifest(tmp, err);
    if (st == MOE_OK) st = moe_fsync_dir(tmp, err);
    if (st == MOE_OK && rename(tmp, out) != 0)
        st = moe_err_errno(err, out, "cannot rename the finished checkpoint into place");
    if (st != MOE_OK) return st;
    char parent[MOE_CKPT_PATH_MAX];
    snprintf(parent, sizeof parent, "%s", out);
    size_t len = strlen(parent);
    while (len > 1 && parent[len - 1] == '/')
        parent[--len] = '\0';
    char *slash = strrchr(parent, '/');
    if (!slash)
        snprintf(parent, sizeof parent, ".");
    else if (slash == parent)
        parent[1] = '\0';
    else
        *slash = '\0';
    return moe_fsync_dir(parent, err);
}

moe_status moe_convert_reshard(const char *ckpt_path, const char *out_arg, int ep, int n_overrides,
                               char *const *overrides, moe_err *err) {
    char out_dir[MOE_CKPT_PATH_MAX - 64];
    if (moe_convert_out_dir(out_arg, out_dir, sizeof out_dir, err) != MOE_OK) return MOE_ERR_INPUT;
    struct stat sb;
    if (stat(out_dir, &sb) == 0) {
        moe_err_set(err, MOE_ERR_INPUT, out_dir, "the output already exists");
        moe_err_hint(err, "choose a new output directory (nothing is overwritten)");
        return MOE_ERR_INPUT;
    }
    moe_ckpt in;
    moe_status st = moe_ckpt_open(&in, ckpt_path, MOE_CKPT_OPTIMIZER, err);
    if (st != MOE_OK) return st;
    moe_config out;
    char path[MOE_CKPT_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/config.yaml", in.dir);
    st = out_config(&in.cfg, path, ep, n_overrides, overrides, &out, err);
    if (st != MOE_OK) {
        moe_ckpt_close(&in);
        return st;
    }

    char tmp[MOE_CKPT_PATH_MAX];
    int64_t E = in.cfg.model.num_local_experts;
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", out_dir, (int)getpid()) >= (int)sizeof tmp)
        st = moe_err_set(err, MOE_ERR_INPUT, out_dir, "path too long");
    if (st == MOE_OK && stat(tmp, &sb) == 0) st = moe_remove_tree(tmp, err);
    if (st == MOE_OK) st = moe_mkdirs(tmp, err);
    int made = st == MOE_OK;
    if (st == MOE_OK) st = write_config(&out, tmp, err);
    if (st == MOE_OK) st = copy_other_files(&in, tmp, err);
    for (int r = 0; st == MOE_OK && r < ep; r++)
        st = write_rank(&in, r, ep, E, tmp, err);
    if (st == MOE_OK && ep > 1) st = moe_ckpt_write_index(tmp, &in.table, ep, err);
    if (st == MOE_OK) st = publish(tmp, out_dir, err);
    if (st != MOE_OK && made) moe_remove_tree(tmp, NULL);
    if (st == MOE_OK)
        moe_log_info("wrote %s: %d tensors, ep %d (was %d): %s", out_dir, in.table.n_params, ep,
                     in.ep,
                     ep == 1 ? "model.safetensors + optimizer-rank0.safetensors"
                             : "index + one model and one optimizer file per EP rank");
    moe_ckpt_close(&in);
    return st;
}
