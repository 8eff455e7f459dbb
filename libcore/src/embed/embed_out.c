/* embed_out: moe-embed's outputs - a .npy matrix plus its .ids.tsv row table, or TSV text.
 *
 *   pooled      npy [sequences, C]   ids.tsv: row name bases tokens windows
 *   per-window  npy [windows, C]     ids.tsv: row name bases tokens window start end
 *   per-token   npy [tokens, C]      ids.tsv: row name bases tokens windows first_row
 *                                    (rows first_row .. first_row + tokens - 1 are its tokens)
 *   TSV text    name<TAB>v1..., with a window index (per-window) or token position
 *               (per-token) as second column.
 *
 * The one thing to know: both files are moe_outfiles, so they appear together at commit
 * or not at all; TSV values are printed with 9 significant digits (exact for f32) after
 * rounding to the output dtype, so TSV and .npy always hold the same numbers. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "embed/embed_internal.h"
#include "moe/dtype.h"

moe_status moe_embed_out_open(embed_out *w, const moe_embed_opts *o, int64_t C, moe_err *err) {
    memset(w, 0, sizeof *w);
    w->C = C;
    w->row = malloc((size_t)C * sizeof(float));
    if (!w->row) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    if (!o->output || strcmp(o->output, "-") == 0) {
        w->tsv = 1;
        return MOE_OK;
    }
    size_t len = strlen(o->output);
    int has_ext = len > 4 && strcmp(o->output + len - 4, ".npy") == 0;
    if (snprintf(w->ids_path, sizeof w->ids_path, "%.*s.ids.tsv", (int)(has_ext ? len - 4 : len),
                 o->output) >= (int)sizeof w->ids_path)
        return moe_err_set(err, MOE_ERR_INPUT, o->output, "output path too long");
    moe_status st = moe_npy_writer_open(&w->npy, o->output, o->dtype, C, err);
    if (st != MOE_OK) return st;
    w->npy_open = 1;
    if (w->npy.out.special) { /* -o /dev/null: no "/dev/null.ids.tsv" beside a device */
        moe_log_info("%s is a device: no .ids.tsv is written", o->output);
        return MOE_OK;
    }
    st = moe_outfile_open(&w->ids, w->ids_path, err);
    if (st != MOE_OK) return st;
    w->ids_open = 1;
    const char *hdr = o->per_window  ? "row\tname\tbases\ttokens\twindow\tstart\tend\n"
                      : o->per_token ? "row\tname\tbases\ttokens\twindows\tfirst_row\n"
                                     : "row\tname\tbases\ttokens\twindows\n";
    return moe_outfile_write(&w->ids, hdr, strlen(hdr), err);
}

/* One row: acc [C] doubles -> f32 (rounded to f16 when that is the output dtype). */
static moe_status put_row(embed_out *w, const moe_embed_opts *o, const double *acc,
                          const char *name, const char *extra, moe_err *err) {
    for (int64_t c = 0; c < w->C; c++) {
        float v = (float)acc[c];
        w->row[c] = o->dtype == MOE_NPY_F16 ? moe_f16_to_f32(moe_f32_to_f16(v)) : v;
        if (!isfinite(w->row[c])) { /* never written: all the rows go, or none */
            moe_err_set(err, MOE_ERR_RUNTIME, o->ckpt_dir,
                        "row %lld (%s) has a non-finite value %g in column %lld: no output "
                        "is written",
                        (long long)w->rows, name, (double)w->row[c], (long long)c);
            moe_err_hint(err, isfinite(v) ? "the value overflows float16: use --dtype f32"
                                          : "the checkpoint's weights hold NaN or Inf (moe-convert "
                                            "inspect shows max|x|); use an earlier checkpoint");
            return MOE_ERR_RUNTIME;
        }
    }
    if (!w->tsv) {
        moe_status st = moe_npy_writer_append(&w->npy, w->row, 1, err);
        if (st == MOE_OK) w->rows++;
        return st;
    }
    fputs(name, stdout);
    if (extra) printf("\t%s", extra);
    for (int64_t c = 0; c < w->C; c++)
        printf("\t%.9g", (double)w->row[c]);
    if (putchar('\n') == EOF) return moe_err_errno(err, "-", "cannot write to stdout");
    w->rows++;
    return MOE_OK;
}

static moe_status put_ids(embed_out *w, const char *line, moe_err *err) {
    if (!w->ids_open) return MOE_OK;
    return moe_outfile_write(&w->ids, line, strlen(line), err);
}

moe_status moe_embed_out_seq(embed_out *w, const moe_embed_opts *o, const embed_seq *s,
                             int64_t stride, int64_t window, moe_err *err) {
    int64_t C = w->C;
    char line[4608], extra[64];
    moe_status st = MOE_OK;
    if (o->per_window) {
        for (int64_t k = 0; st == MOE_OK && k < s->n_win; k++) {
            int64_t a = k * stride, b = a + window < s->n ? a + window : s->n;
            snprintf(line, sizeof line,
                     "%" PRId64 "\t%s\t%" PRId64 "\t%" PRId64 "\t%" PRId64 "\t%" PRId64 "\t%" PRId64
                     "\n",
                     w->rows, s->name, s->bases, s->n, k, a, b);
            snprintf(extra, sizeof extra, "%" PRId64, k);
            st = put_ids(w, line, err);
            if (st == MOE_OK) st = put_row(w, o, s->acc + k * C, s->name, extra, err);
        }
    } else if (o->per_token) {
        snprintf(line, sizeof line,
                 "%" PRId64 "\t%s\t%" PRId64 "\t%" PRId64 "\t%" PRId64 "\t%" PRId64 "\n",
                 w->seq_rows, s->name, s->bases, s->n, s->n_win, w->rows);
        st = put_ids(w, line, err);
        for (int64_t i = 0; st == MOE_OK && i < s->n; i++) {
            snprintf(extra, sizeof extra, "%" PRId64, i);
            st = put_row(w, o, s->acc + i * C, s->name, extra, err);
        }
    } else {
        snprintf(line, sizeof line, "%" PRId64 "\t%s\t%" PRId64 "\t%" PRId64 "\t%" PRId64 "\n",
                 w->rows, s->name, s->bases, s->n, s->n_win);
        st = put_ids(w, line, err);
        if (st == MOE_OK) st = put_row(w, o, s->acc, s->name, NULL, err);
    }
    if (st == MOE_OK) w->seq_rows++;
    return st;
}

moe_status moe_embed_out_commit(embed_out *w, moe_err *err) {
    moe_status st = MOE_OK;
    if (w->tsv) {
        if (fflush(stdout) != 0) st = moe_err_errno(err, "-", "cannot write to stdout");
    } else {
        w->npy_open = 0;
        st = moe_npy_writer_commit(&w->npy, err);
        if (st == MOE_OK && w->ids_open) {
            w->ids_open = 0;
            st = moe_outfile_commit(&w->ids, err);
        }
    }
    moe_embed_out_abort(w);
    return st;
}

void moe_embed_out_abort(embed_out *w) {
    if (w->npy_open) moe_npy_writer_abort(&w->npy);
    if (w->ids_open) moe_outfile_abort(&w->ids);
    w->npy_open = w->ids_open = 0;
    free(w->row);
    w->row = NULL;
}
