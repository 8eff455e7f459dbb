/* embed_out: moe-embed's outputs - a .npy matrix plus its .ids.tsv row table, or TSV text.
 *
 * Every ids table starts with one provenance line ("#@PG ID:moe-embed VN CL DS", samtools
 * style) and a header; each row gives the source interval of its bases as BED does
 * (chrom, 0-based start, half-open end, strand) and a unique id (name_row):
 *   pooled      npy [sequences, C]   ids.tsv: row id name chrom start end strand bases tokens
 *                                             windows
 *   per-window  npy [windows, C]     ids.tsv: ... bases tokens window tok_start tok_end
 *   per-token   npy [tokens, C]      ids.tsv: ... bases tokens windows first_row
 *                                    (rows first_row .. first_row + tokens - 1 are its tokens)
 *                                    offsets.tsv: row seq token chrom start end strand, one
 *                                    line per npy row
 *   TSV text    name<TAB>v1..., with a window index (per-window) or token position
 *               (per-token) as second column.
 *
 * The one thing to know: all files are moe_outfiles, so they appear together at commit
 * or not at all; TSV values are printed with 9 significant digits (exact for f32) after
 * rounding to the output dtype, so TSV and .npy always hold the same numbers. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "embed/embed_internal.h"
#include "moe/dtype.h"

/* FILE.<ext> beside the .npy path (its .npy suffix replaced) into out [4200]. */
static moe_status side_path(char *out, const char *npy, const char *ext, moe_err *err) {
    size_t len = strlen(npy);
    int has_ext = len > 4 && strcmp(npy + len - 4, ".npy") == 0;
    if (snprintf(out, 4200, "%.*s%s", (int)(has_ext ? len - 4 : len), npy, ext) >= 4200)
        return moe_err_set(err, MOE_ERR_INPUT, npy, "output path too long");
    return MOE_OK;
}

moe_status moe_embed_out_open(embed_out *w, const moe_embed_opts *o, int64_t C, const char *prov,
                              moe_err *err) {
    memset(w, 0, sizeof *w);
    w->C = C;
    w->row = malloc((size_t)C * sizeof(float));
    if (!w->row) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    if (!o->output || strcmp(o->output, "-") == 0) {
        w->tsv = 1;
        return MOE_OK;
    }
    moe_status st = side_path(w->ids_path, o->output, ".ids.tsv", err);
    if (st == MOE_OK && o->per_token) st = side_path(w->offs_path, o->output, ".offsets.tsv", err);
    if (st == MOE_OK) st = moe_npy_writer_open(&w->npy, o->output, o->dtype, C, err);
    if (st != MOE_OK) return st;
    w->npy_open = 1;
    if (w->npy.out.special) { /* -o /dev/null: no "/dev/null.ids.tsv" beside a device */
        moe_log_info("%s is a device: no .ids.tsv is written", o->output);
        return MOE_OK;
    }
    st = moe_outfile_open(&w->ids, w->ids_path, err);
    if (st != MOE_OK) return st;
    w->ids_open = 1;
    if (prov) {
        st = moe_outfile_write(&w->ids, "#", 1, err);
        if (st == MOE_OK) st = moe_outfile_write(&w->ids, prov, strlen(prov), err);
        if (st == MOE_OK) st = moe_outfile_write(&w->ids, "\n", 1, err);
        if (st != MOE_OK) return st;
    }
    const char *hdr = o->per_window  ? "window\ttok_start\ttok_end\n"
                      : o->per_token ? "windows\tfirst_row\n"
                                     : "windows\n";
    const char *lead = "row\tid\tname\tchrom\tstart\tend\tstrand\tbases\ttokens\t";
    st = moe_outfile_write(&w->ids, lead, strlen(lead), err);
    if (st == MOE_OK) st = moe_outfile_write(&w->ids, hdr, strlen(hdr), err);
    if (st != MOE_OK || !o->per_token) return st;
    st = moe_outfile_open(&w->offs, w->offs_path, err);
    if (st != MOE_OK) return st;
    w->offs_open = 1;
    const char *oh = "row\tseq\ttoken\tchrom\tstart\tend\tstrand\n";
    return moe_outfile_write(&w->offs, oh, strlen(oh), err);
}

/* The source interval of tokens [a, b) of s (BED: 0-based, half-open) into iv [2]. */
static void seq_interval(const embed_seq *s, int64_t a, int64_t b, int64_t *iv) {
    int64_t lo = a < b ? s->span[2 * a] : 0, hi = a < b ? s->span[2 * (b - 1) + 1] : 0;
    iv[0] = s->src_start + (s->flip ? s->bases - hi : lo);
    iv[1] = s->src_start + (s->flip ? s->bases - lo : hi);
}

/* "row id name chrom start end strand bases tokens " of an ids line for tokens [a, b). */
static void ids_lead(char *line, size_t cap, int64_t row, const embed_seq *s, int64_t a,
                     int64_t b) {
    int64_t iv[2];
    seq_interval(s, a, b, iv);
    snprintf(line, cap,
             "%" PRId64 "\t%s_%" PRId64 "\t%s\t%s\t%" PRId64 "\t%" PRId64 "\t%c\t%" PRId64
             "\t%" PRId64 "\t",
             row, s->name, row, s->name, s->name, iv[0], iv[1], s->strand, s->bases, s->n);
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
    size_t n;
    moe_status st = MOE_OK;
    if (o->per_window) {
        for (int64_t k = 0; st == MOE_OK && k < s->n_win; k++) {
            int64_t a = k * stride, b = a + window < s->n ? a + window : s->n;
            ids_lead(line, sizeof line, w->rows, s, a, b);
            n = strlen(line);
            snprintf(line + n, sizeof line - n, "%" PRId64 "\t%" PRId64 "\t%" PRId64 "\n", k, a, b);
            snprintf(extra, sizeof extra, "%" PRId64, k);
            st = put_ids(w, line, err);
            if (st == MOE_OK) st = put_row(w, o, s->acc + k * C, s->name, extra, err);
        }
    } else if (o->per_token) {
        ids_lead(line, sizeof line, w->seq_rows, s, 0, s->n);
        n = strlen(line);
        snprintf(line + n, sizeof line - n, "%" PRId64 "\t%" PRId64 "\n", s->n_win, w->rows);
        st = put_ids(w, line, err);
        for (int64_t i = 0; st == MOE_OK && i < s->n; i++) {
            if (!w->tsv) {
                int64_t iv[2];
                seq_interval(s, i, i + 1, iv);
                snprintf(line, sizeof line,
                         "%" PRId64 "\t%" PRId64 "\t%" PRId64 "\t%s\t%" PRId64 "\t%" PRId64
                         "\t%c\n",
                         w->rows, w->seq_rows, i, s->name, iv[0], iv[1], s->strand);
                st = moe_outfile_write(&w->offs, line, strlen(line), err);
            }
            snprintf(extra, sizeof extra, "%" PRId64, i);
            if (st == MOE_OK) st = put_row(w, o, s->acc + i * C, s->name, extra, err);
        }
    } else {
        ids_lead(line, sizeof line, w->rows, s, 0, s->n);
        n = strlen(line);
        snprintf(line + n, sizeof line - n, "%" PRId64 "\n", s->n_win);
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
        if (st == MOE_OK && w->offs_open) {
            w->offs_open = 0;
            st = moe_outfile_commit(&w->offs, err);
        }
    }
    moe_embed_out_abort(w);
    return st;
}

void moe_embed_out_abort(embed_out *w) {
    if (w->npy_open) moe_npy_writer_abort(&w->npy);
    if (w->ids_open) moe_outfile_abort(&w->ids);
    if (w->offs_open) moe_outfile_abort(&w->offs);
    w->npy_open = w->ids_open = w->offs_open = 0;
    free(w->row);
    w->row = NULL;
}
