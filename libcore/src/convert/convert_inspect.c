/* convert_inspect: moe-convert inspect - what is in a checkpoint (or in a Hugging Face
 * directory, or any directory or file of safetensors): config, tokenizer, every tensor with shape,
 * dtype, RMS and max |x| of the finite values, NaN and Inf counts, parameter counts, and the
 * MANIFEST check.
 *
 * The one thing to know: the report is printed in full even when the MANIFEST check
 * fails (that is when people want to look), and the failure is then returned, so the
 * exit status still says the checkpoint is damaged. */
#include <dirent.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "moe/ckpt.h"
#include "moe/convert.h"
#include "moe/fileio.h"
#include "moe/model.h"

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every *.safetensors file of dir except optimizer state, sorted; or dir itself if it is
 * a file. */
static moe_status list_files(const char *dir, char ***out, int *n, moe_err *err) {
    *out = NULL;
    *n = 0;
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return moe_err_set(err, MOE_ERR_INPUT, dir, "no such file or directory");
    if (!S_ISDIR(sb.st_mode)) {
        *out = malloc(sizeof **out);
        if (!*out || !((*out)[0] = strdup(dir)))
            return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
        *n = 1;
        return MOE_OK;
    }
    DIR *d = opendir(dir);
    if (!d) return moe_err_errno(err, dir, "cannot list the directory");
    struct dirent *e;
    int cap = 0;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 12 || strcmp(e->d_name + len - 12, ".safetensors") != 0 ||
            strncmp(e->d_name, "optimizer", 9) == 0 || e->d_name[0] == '.')
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 8;
            char **p = realloc(*out, (size_t)cap * sizeof *p);
            if (!p) break;
            *out = p;
        }
        size_t m = strlen(dir) + len + 2;
        char *path = malloc(m);
        if (!path) break;
        snprintf(path, m, "%s/%s", dir, e->d_name);
        (*out)[(*n)++] = path;
    }
    closedir(d);
    if (*n) qsort(*out, (size_t)*n, sizeof **out, cmp_str);
    return MOE_OK;
}

/* What the tensor listing adds up: elements, bytes, and the non-finite values (with the
 * first tensor that holds any). */
typedef struct inspect_totals {
    int64_t elems, bytes, nan, inf, bad_tensors;
    char first_bad[160];
} inspect_totals;

/* One line per tensor of f: name, dtype, shape, RMS and max |x| of its finite values, and
 * how many values are NaN and how many +-Inf (a NaN would hide in max |x| and poison RMS). */
static void print_tensors(const moe_st_file *f, FILE *out, inspect_totals *tot) {
    float *buf = NULL;
    int64_t cap = 0;
    fprintf(out, "\n%s: %d tensors\n", f->path, f->n_tensors);
    fprintf(out, "  %-64s %-5s %-22s %12s %12s %8s %8s\n", "name", "dtype", "shape", "rms",
            "max|x|", "nan", "inf");
    for (int i = 0; i < f->n_tensors; i++) {
        const moe_st_tensor *t = &f->tensors[i];
        char shape[64] = "[";
        for (int d = 0; d < t->ndim; d++) {
            char dim[24];
            snprintf(dim, sizeof dim, "%s%" PRId64, d ? ", " : "", t->shape[d]);
            strncat(shape, dim, sizeof shape - strlen(shape) - 2);
        }
        strcat(shape, "]");
        double ss = 0, mx = 0;
        int64_t nan = 0, inf = 0;
        int stats = 0;
        if (t->numel > cap) {
            float *p = realloc(buf, (size_t)t->numel * sizeof(float));
            if (p) {
                buf = p;
                cap = t->numel;
            }
        }
        if (t->numel <= cap && moe_st_read_f32(f, t, buf, NULL) == MOE_OK) {
            for (int64_t k = 0; k < t->numel; k++) {
                double v = buf[k];
                if (isnan(v)) {
                    nan++;
                } else if (isinf(v)) {
                    inf++;
                } else {
                    ss += v * v;
                    if (fabs(v) > mx) mx = fabs(v);
                }
            }
            stats = 1;
        }
        int64_t finite = t->numel - nan - inf;
        if (stats)
            fprintf(out, "  %-64s %-5s %-22s %12.6g %12.6g %8" PRId64 " %8" PRId64 "\n", t->name,
                    moe_st_dtype_name(t->dtype), shape, finite ? sqrt(ss / (double)finite) : 0.0,
                    mx, nan, inf);
        else
            fprintf(out, "  %-64s %-5s %-22s %12s %12s %8s %8s\n", t->name,
                    moe_st_dtype_name(t->dtype), shape, "-", "-", "-", "-");
        if ((nan || inf) && tot->bad_tensors++ == 0)
            snprintf(tot->first_bad, sizeof tot->first_bad, "%s", t->name);
        tot->nan += nan;
        tot->inf += inf;
        tot->elems += t->numel;
        tot->bytes += (int64_t)(t->end - t->begin);
    }
    free(buf);
}

/* "layout: ..." - which file holds what (moe/ckpt.h) of an opened checkpoint, or the reason
 * its layout did not validate. */
static void print_layout(const moe_ckpt *ct, FILE *out) {
    const moe_err *lerr = &ct->part_err[MOE_CKPT_PART_TENSORS];
    if (lerr->status != MOE_OK) {
        fprintf(out, "layout: INVALID: %s\n", lerr->msg);
        return;
    }
    int64_t E = ct->cfg.model.num_local_experts, per = E / ct->ep;
    const char *none = "no optimizer state (weights only: Adam moments start at zero)";
    if (ct->ep == 1) {
        fprintf(out, "layout: single file (ep 1): model.safetensors, %s\n",
                ct->weights_only ? none : "optimizer-rank0.safetensors");
    } else {
        fprintf(out,
                "layout: expert-parallel, ep %d (%s + %d model files, experts split "
                "%" PRId64 " per rank):\n",
                ct->ep, MOE_CKPT_INDEX_FILE, ct->ep, per);
        for (int r = 0; r < ct->ep; r++) {
            char mf[64], of[64], ex[64];
            moe_ckpt_model_file(r, ct->ep, mf, sizeof mf);
            moe_ckpt_optim_file(r, of, sizeof of);
            if (per == 1)
                snprintf(ex, sizeof ex, "expert %" PRId64, (int64_t)r);
            else
                snprintf(ex, sizeof ex, "experts %" PRId64 "-%" PRId64, r * per, (r + 1) * per - 1);
            fprintf(out, "  rank %d: %s (%s%s, %d tensors), %s\n", r, mf, r == 0 ? "dense + " : "",
                    ex, ct->model[r].n_tensors, ct->weights_only ? "no optimizer file" : of);
        }
        if (ct->weights_only) fprintf(out, "  %s\n", none);
    }
}

/* Whether dir is a checkpoint (it has a MANIFEST) or a run directory (a `latest` file or
 * complete checkpoints; a damaged `latest` counts, so that opening it names the damage). */
static int is_checkpoint(const char *dir) {
    char path[MOE_CKPT_PATH_MAX + 16], latest[MOE_CKPT_PATH_MAX];
    struct stat sb;
    snprintf(path, sizeof path, "%s/MANIFEST", dir);
    if (stat(path, &sb) == 0) return 1;
    int found = 0;
    moe_err sub;
    moe_err_clear(&sub);
    return moe_ckpt_latest(dir, latest, sizeof latest, &found, &sub) != MOE_OK || found;
}

/* The checkpoint part of the report: MANIFEST, config, layout, tokenizer, trainer state.
 * *manifest and *layout get the failures that make inspect fail (the rest is printed). */
static void print_ckpt(const moe_ckpt *ck, FILE *out, moe_err *manifest, moe_err *layout) {
    const moe_err *merr = &ck->part_err[MOE_CKPT_PART_MANIFEST];
    fprintf(out, "checkpoint %s\nMANIFEST: %s%s\n", ck->dir,
            merr->status == MOE_OK ? "ok (sizes and CRC32 of every file match)" : "FAILED: ",
            merr->status == MOE_OK ? "" : merr->msg);
    *manifest = *merr;
    const moe_err *cerr = &ck->part_err[MOE_CKPT_PART_CONFIG];
    if (cerr->status == MOE_OK) {
        const moe_model_config *m = &ck->cfg.model;
        int64_t total, active;
        moe_model_count_params(m, &total, &active);
        fprintf(out,
                "model: vocab %" PRId64 ", hidden %" PRId64 ", intermediate %" PRId64
                ", layers %" PRId64 ", heads %" PRId64 "/%" PRId64 " kv, experts %" PRId64
                " (top-%" PRId64 "), context %" PRId64 ", rope_theta %g, tied %s\n"
                "parameters: %" PRId64 " total, %" PRId64 " active per token; recipe %s\n",
                m->vocab_size, m->hidden_size, m->intermediate_size, m->num_hidden_layers,
                m->num_attention_heads, m->num_key_value_heads, m->num_local_experts,
                m->num_experts_per_tok, m->max_position_embeddings, m->rope_theta,
                m->tie_word_embeddings ? "yes" : "no", total, active,
                moe_recipe_name(ck->cfg.precision.recipe));
        print_layout(ck, out);
        *layout = ck->part_err[MOE_CKPT_PART_TENSORS];
    } else {
        fprintf(out, "config.yaml: unreadable: %s\n", cerr->msg);
    }
    const moe_err *terr = &ck->part_err[MOE_CKPT_PART_TOKENIZER];
    if (terr->status == MOE_OK && ck->tok)
        fprintf(out,
                "tokenizer: %s, %" PRId64 " tokens, vocabulary hash %016" PRIx64 "\n  spec: %s\n",
                ck->tok->name, ck->tok->vocab_size, ck->tok->vocab_hash,
                moe_tokenizer_spec_json(ck->tok));
    else
        fprintf(out, "tokenizer.json: unreadable: %s\n", terr->msg);
    char path[MOE_CKPT_PATH_MAX + 24], *json;
    size_t len;
    snprintf(path, sizeof path, "%s/trainer_state.json", ck->dir);
    if (moe_read_file(path, &json, &len, NULL) == MOE_OK) {
        fprintf(out, "trainer_state.json: %s", json);
        if (len && json[len - 1] != '\n') fputc('\n', out);
        free(json);
    }
}

moe_status moe_convert_inspect(const char *dir, const moe_convert_opts *o, FILE *out,
                               moe_err *err) {
    (void)o;
    char path[4400], where[MOE_CKPT_PATH_MAX]; /* where: the directory whose files are listed */
    snprintf(where, sizeof where, "%s", dir);
    int is_ckpt = is_checkpoint(dir);
    moe_status manifest = MOE_OK;
    moe_err merr, lerr;
    moe_err_clear(&merr);
    moe_err_clear(&lerr);
    if (is_ckpt) { /* a checkpoint, or a run directory meaning its latest */
        moe_ckpt ck;
        moe_status st = moe_ckpt_open(&ck, dir, MOE_CKPT_OPTIMIZER | MOE_CKPT_REPORT, err);
        if (st != MOE_OK) return st;
        snprintf(where, sizeof where, "%s", ck.dir);
        print_ckpt(&ck, out, &merr, &lerr);
        manifest = merr.status;
        moe_ckpt_close(&ck);
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *hf = is_ckpt ? NULL : json_load_file(path, 0, NULL);
    if (json_is_object(hf)) { /* a Hugging Face directory: its config in one line */
        const char *keys[] = {"model_type",          "vocab_size",
                              "hidden_size",         "intermediate_size",
                              "num_hidden_layers",   "num_attention_heads",
                              "num_key_value_heads", "num_local_experts",
                              "num_experts_per_tok", "max_position_embeddings",
                              "torch_dtype"};
        fprintf(out, "Hugging Face directory %s\nconfig.json:", dir);
        for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
            json_t *v = json_object_get(hf, keys[k]);
            if (json_is_string(v))
                fprintf(out, " %s=%s", keys[k], json_string_value(v));
            else if (json_is_integer(v))
                fprintf(out, " %s=%" JSON_INTEGER_FORMAT, keys[k], json_integer_value(v));
        }
        fputc('\n', out);
    }
    json_decref(hf);
    char **files;
    int n;
    moe_status st = list_files(where, &files, &n, err);
    if (st != MOE_OK) return st;
    if (n == 0 && !is_ckpt) {
        moe_err_set(err, MOE_ERR_INPUT, dir, "no checkpoint (MANIFEST) and no *.safetensors here");
        st = MOE_ERR_INPUT;
    }
    inspect_totals tot = {0};
    for (int i = 0; st == MOE_OK && i < n; i++) {
        moe_st_file f;
        st = moe_st_open(&f, files[i], err);
        if (st != MOE_OK) break;
        print_tensors(&f, out, &tot);
        moe_st_close(&f);
    }
    for (int i = 0; i < n; i++)
        free(files[i]);
    free(files);
    if (st == MOE_OK) {
        fprintf(out, "\ntotal: %" PRId64 " elements in %" PRId64 " bytes of tensor data\n",
                tot.elems, tot.bytes);
        if (tot.bad_tensors)
            fprintf(out,
                    "non-finite: %" PRId64 " NaN and %" PRId64 " Inf values in %" PRId64
                    " tensors (the first: %s)\n",
                    tot.nan, tot.inf, tot.bad_tensors, tot.first_bad);
        else
            fprintf(out, "non-finite: none\n");
    }
    if (st == MOE_OK && manifest != MOE_OK) {
        *err = merr;
        st = manifest;
    }
    if (st == MOE_OK && lerr.status != MOE_OK) {
        *err = lerr;
        st = lerr.status;
    }
    return st;
}
