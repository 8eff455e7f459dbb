/* metrics: see moe/metrics.h. The SVG is plain text assembled here (no library): a plot
 * area with a light grid, x ticks in steps, y ticks in bits per base on a log scale, two
 * polylines and a legend. metrics.tsv is derived from metrics.jsonl, its one source. */
#include "moe/metrics.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "moe/fileio.h"

void moe_metrics_history_init(moe_metrics_history *h) {
    memset(h, 0, sizeof *h);
}

void moe_metrics_history_free(moe_metrics_history *h) {
    free(h->pts);
    memset(h, 0, sizeof *h);
}

moe_status moe_metrics_history_add(moe_metrics_history *h, int64_t step, double bpb, double val_bpb,
                                   moe_err *err) {
    if (h->n > 0 && h->pts[h->n - 1].step == step) {
        moe_metrics_point *p = &h->pts[h->n - 1];
        if (!isnan(bpb)) p->bpb = bpb;
        if (!isnan(val_bpb)) p->val_bpb = val_bpb;
        return MOE_OK;
    }
    if (h->n == h->cap) {
        int64_t cap = h->cap ? 2 * h->cap : 256;
        moe_metrics_point *p = realloc(h->pts, (size_t)cap * sizeof *p);
        if (!p) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
        h->pts = p;
        h->cap = cap;
    }
    h->pts[h->n++] = (moe_metrics_point){step, bpb, val_bpb};
    return MOE_OK;
}

/* The next non-empty line of JSON-lines text at *cur (cut in place; *cur advances, *line
 * counts lines): the line into *text, its parsed value into *o (the caller's; NULL when the
 * line is not JSON), *torn = 1 when it was the last and had no newline. 0 at the end. */
static int next_json_line(char **cur, int64_t *line, char **text, json_t **o, int *torn) {
    for (char *p = *cur; *p;) {
        char *nl = strchr(p, '\n');
        if (nl) *nl = '\0';
        *cur = nl ? nl + 1 : p + strlen(p);
        (*line)++;
        if (*p) {
            json_error_t jerr;
            *o = json_loads(p, 0, &jerr);
            *text = p;
            *torn = !nl;
            return 1;
        }
        p = *cur;
    }
    return 0;
}

moe_status moe_metrics_jsonl_truncate(const char *path, int64_t max_step, moe_metrics_history *h,
                                      moe_err *err) {
    FILE *probe = fopen(path, "rb");
    if (!probe) return MOE_OK;
    fclose(probe);
    char *text;
    size_t len;
    moe_status st = moe_read_file(path, &text, &len, err);
    if (st != MOE_OK) return st;
    moe_outfile out;
    st = moe_outfile_open(&out, path, err);
    if (st != MOE_OK) {
        free(text);
        return st;
    }
    int64_t line = 0;
    json_t *o;
    int torn;
    char *p;
    for (char *cur = text; st == MOE_OK && next_json_line(&cur, &line, &p, &o, &torn);) {
        json_t *js = o ? json_object_get(o, "step") : NULL;
        if (!json_is_object(o) || !json_is_integer(js)) {
            json_decref(o);
            if (torn) break; /* a torn last line from a crash: drop it */
            st = moe_err_set(err, MOE_ERR_INPUT, path,
                             "expected a JSON object with an integer \"step\"");
            moe_err_at_line(err, line, 0);
            moe_err_hint(err, "move the damaged metrics.jsonl away and resume again");
            break;
        }
        int64_t step = json_integer_value(js);
        if (step <= max_step) {
            json_t *jl = json_object_get(o, "bits_per_base");
            json_t *jv = json_object_get(o, "val_bits_per_base");
            st = moe_metrics_history_add(h, step, json_is_number(jl) ? json_number_value(jl) : NAN,
                                         json_is_number(jv) ? json_number_value(jv) : NAN, err);
            if (st == MOE_OK) st = moe_outfile_write(&out, p, strlen(p), err);
            if (st == MOE_OK) st = moe_outfile_write(&out, "\n", 1, err);
        }
        json_decref(o);
    }
    free(text);
    if (st == MOE_OK) return moe_outfile_commit(&out, err);
    moe_outfile_abort(&out);
    return st;
}

void moe_metrics_ticks(double lo, double hi, double *first, double *spacing, int *count) {
    if (!(hi > lo)) {
        double pad = fabs(lo) > 0 ? fabs(lo) * 0.05 : 0.5;
        lo -= pad;
        hi += pad;
    }
    double raw = (hi - lo) / 6.0, mag = pow(10.0, floor(log10(raw))), r = raw / mag;
    double sp = (r <= 1.0 ? 1.0 : r <= 2.0 ? 2.0 : r <= 5.0 ? 5.0 : 10.0) * mag;
    double f = ceil(lo / sp - 1e-9) * sp;
    int n = 0;
    while (f + n * sp <= hi + sp * 1e-9 && n < 20)
        n++;
    *first = f;
    *spacing = sp;
    *count = n;
}

/* Formats a tick value with as many decimals as the spacing needs. */
static void fmt_tick(char *buf, size_t n, double v, double spacing) {
    int dec = spacing >= 1 ? 0 : (int)ceil(-log10(spacing) - 1e-9);
    if (dec > 6) dec = 6;
    if (fabs(v) < spacing * 1e-6) v = 0;
    snprintf(buf, n, "%.*f", dec, v);
}

typedef struct svg_buf {
    char *s;
    size_t n, cap;
    int failed;
} svg_buf;

static void put(svg_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(svg_buf *b, const char *fmt, ...) {
    if (b->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->failed = 1;
            return;
        }
        if ((size_t)k < b->cap - b->n) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = 2 * b->cap + (size_t)k + 1;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->failed = 1;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

static void escape_xml(svg_buf *b, const char *t) {
    for (; *t; t++) {
        switch (*t) {
        case '<':
            put(b, "&lt;");
            break;
        case '>':
            put(b, "&gt;");
            break;
        case '&':
            put(b, "&amp;");
            break;
        case '"':
            put(b, "&quot;");
            break;
        default:
            put(b, "%c", *t);
        }
    }
}

/* The y ticks of a log axis over [lo, hi] (0 < lo < hi) into t [24]: nice linear ticks
 * within a decade, 1-2-5 per decade over wider ranges. Returns the count. */
static int log_ticks(double lo, double hi, double *t) {
    int n = 0;
    if (hi / lo <= 10) {
        double f, sp;
        int c;
        moe_metrics_ticks(lo, hi, &f, &sp, &c);
        if (c < 3) { /* a narrow range: halve the spacing so that a few ticks show */
            sp /= 2;
            f = ceil(lo / sp - 1e-9) * sp;
            c = (int)floor((hi - f) / sp + 1e-9) + 1;
        }
        for (int i = 0; i < c && n < 24; i++)
            if (f + i * sp >= lo && f + i * sp <= hi) t[n++] = f + i * sp;
        return n;
    }
    for (int k = (int)floor(log10(lo)); k <= (int)ceil(log10(hi)); k++)
        for (int m = 1; m <= 5 && n < 24; m += m == 1 ? 1 : 3) {
            double v = m * pow(10.0, k);
            if (v >= lo && v <= hi) t[n++] = v;
        }
    return n;
}

moe_status moe_metrics_write_svg(const moe_metrics_history *h, const char *path, const char *title,
                                 moe_err *err) {
    const double W = 760, H = 440, ml = 70, mr = 20, mt = 40, mb = 55;
    const double pw = W - ml - mr, ph = H - mt - mb;
    double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
    int64_t n_train = 0, n_val = 0;
    for (int64_t i = 0; i < h->n; i++) {
        const moe_metrics_point *p = &h->pts[i];
        int has_t = isfinite(p->bpb) && p->bpb > 0, has_v = isfinite(p->val_bpb) && p->val_bpb > 0;
        if (!has_t && !has_v) continue;
        xmin = fmin(xmin, (double)p->step);
        xmax = fmax(xmax, (double)p->step);
        if (has_t) {
            ymin = fmin(ymin, p->bpb);
            ymax = fmax(ymax, p->bpb);
            n_train++;
        }
        if (has_v) {
            ymin = fmin(ymin, p->val_bpb);
            ymax = fmax(ymax, p->val_bpb);
            n_val++;
        }
    }
    if (n_train + n_val == 0) xmin = 0, xmax = 1, ymin = 1, ymax = 2;
    double xf, xs, yt[24];
    int xc;
    /* x spans the steps; y (log10) a little wider than the curves. */
    double x0 = xmin, x1 = xmax > xmin ? xmax : xmin + 1;
    double y0 = log10(ymin) - 0.02, y1 = log10(ymax) + 0.02;
    int yc = log_ticks(pow(10.0, y0), pow(10.0, y1), yt);
    moe_metrics_ticks(x0, x1, &xf, &xs, &xc);
#define SX(v) (ml + ((v)-x0) / (x1 - x0) * pw)
#define SY(v) (mt + ph - (log10(v) - y0) / (y1 - y0) * ph)
    svg_buf b = {0};
    put(&b,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
        "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n",
        W, H, W, H);
    put(&b, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    put(&b, "<text x=\"%.1f\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">", ml + pw / 2);
    escape_xml(&b, title);
    put(&b, "</text>\n<g stroke=\"#e4e4e4\" stroke-width=\"1\">\n");
    for (int i = 0; i < xc; i++) {
        double v = xf + i * xs;
        if (v < x0 || v > x1) continue;
        put(&b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", SX(v), mt, SX(v),
            mt + ph);
    }
    for (int i = 0; i < yc; i++)
        put(&b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", ml, SY(yt[i]), ml + pw,
            SY(yt[i]));
    put(&b,
        "</g>\n<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
        "stroke=\"black\"/>\n",
        ml, mt, pw, ph);
    put(&b, "<g text-anchor=\"middle\">\n");
    for (int i = 0; i < xc; i++) {
        double v = xf + i * xs;
        char t[32];
        if (v < x0 || v > x1) continue;
        fmt_tick(t, sizeof t, v, xs);
        put(&b,
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>"
            "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n",
            SX(v), mt + ph, SX(v), mt + ph + 5, SX(v), mt + ph + 18, t);
    }
    put(&b, "</g>\n<g text-anchor=\"end\">\n");
    for (int i = 0; i < yc; i++) {
        double v = yt[i];
        char t[32];
        snprintf(t, sizeof t, "%.4g", v);
        put(&b,
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>"
            "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n",
            ml - 5, SY(v), ml, SY(v), ml - 8, SY(v) + 4, t);
    }
    put(&b, "</g>\n<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n", ml + pw / 2,
        H - 12);
    put(&b,
        "<text x=\"16\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 16 %.1f)\">"
        "cross-entropy (bits per base, log scale)</text>\n",
        mt + ph / 2, mt + ph / 2);
    if (n_train > 0) {
        put(&b, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"");
        for (int64_t i = 0; i < h->n; i++)
            if (isfinite(h->pts[i].bpb) && h->pts[i].bpb > 0)
                put(&b, "%.1f,%.1f ", SX((double)h->pts[i].step), SY(h->pts[i].bpb));
        put(&b, "\"/>\n");
    }
    if (n_val > 0) {
        put(&b, "<polyline fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\" points=\"");
        for (int64_t i = 0; i < h->n; i++)
            if (isfinite(h->pts[i].val_bpb) && h->pts[i].val_bpb > 0)
                put(&b, "%.1f,%.1f ", SX((double)h->pts[i].step), SY(h->pts[i].val_bpb));
        put(&b, "\"/>\n<g fill=\"#d62728\">\n");
        for (int64_t i = 0; i < h->n; i++)
            if (isfinite(h->pts[i].val_bpb) && h->pts[i].val_bpb > 0)
                put(&b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\"/>\n", SX((double)h->pts[i].step),
                    SY(h->pts[i].val_bpb));
        put(&b, "</g>\n");
    }
    double lx = ml + pw - 150, ly = mt + 12;
    put(&b,
        "<g>\n<rect x=\"%.1f\" y=\"%.1f\" width=\"140\" height=\"44\" fill=\"white\" "
        "stroke=\"#999\"/>\n",
        lx, ly - 4);
    put(&b,
        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#1f77b4\" "
        "stroke-width=\"1.5\"/><text x=\"%.1f\" y=\"%.1f\">train</text>\n",
        lx + 8, ly + 10, lx + 32, ly + 10, lx + 40, ly + 14);
    put(&b,
        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#d62728\" "
        "stroke-width=\"2\"/><circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"#d62728\"/>"
        "<text x=\"%.1f\" y=\"%.1f\">validation</text>\n</g>\n",
        lx + 8, ly + 28, lx + 32, ly + 28, lx + 20, ly + 28, lx + 40, ly + 32);
    put(&b, "</svg>\n");
#undef SX
#undef SY
    if (b.failed) {
        free(b.s);
        return moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory");
    }
    moe_status st = moe_write_text_file(path, b.s, NULL, err);
    free(b.s);
    return st;
}

/* One TSV field for a JSON value into b (numbers with 9 significant digits, arrays joined
 * by commas, null and objects empty). */
static void put_field(svg_buf *b, const json_t *v) {
    if (json_is_integer(v))
        put(b, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v))
        put(b, "%.9g", json_real_value(v));
    else if (json_is_string(v))
        put(b, "%s", json_string_value(v));
    else if (json_is_true(v) || json_is_false(v))
        put(b, "%s", json_is_true(v) ? "true" : "false");
    else if (json_is_array(v))
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) put(b, ",");
            put_field(b, json_array_get(v, i));
        }
}

moe_status moe_metrics_write_tsv(const char *jsonl_path, const char *tsv_path, moe_err *err) {
    char *text;
    size_t len;
    moe_status st = moe_read_file(jsonl_path, &text, &len, err);
    if (st != MOE_OK) return st;
    json_t *rows = json_array(), *keys = json_array();
    int64_t line = 0;
    json_t *o;
    int torn;
    char *p;
    for (char *cur = text; st == MOE_OK && next_json_line(&cur, &line, &p, &o, &torn);) {
        if (!json_is_object(o)) {
            json_decref(o);
            st = moe_err_set(err, MOE_ERR_INPUT, jsonl_path, "expected a JSON object");
            moe_err_at_line(err, line, 0);
            break;
        }
        const char *k;
        json_t *v;
        json_object_foreach(o, k, v) {
            size_t i = 0;
            while (i < json_array_size(keys) &&
                   strcmp(json_string_value(json_array_get(keys, i)), k))
                i++;
            if (i == json_array_size(keys)) json_array_append_new(keys, json_string(k));
        }
        json_array_append_new(rows, o);
    }
    free(text);
    svg_buf b = {0};
    for (size_t i = 0; st == MOE_OK && i < json_array_size(keys); i++)
        put(&b, "%s%s", i ? "\t" : "", json_string_value(json_array_get(keys, i)));
    put(&b, "\n");
    for (size_t r = 0; st == MOE_OK && r < json_array_size(rows); r++) {
        for (size_t i = 0; i < json_array_size(keys); i++) {
            if (i) put(&b, "\t");
            put_field(&b, json_object_get(json_array_get(rows, r),
                                          json_string_value(json_array_get(keys, i))));
        }
        put(&b, "\n");
    }
    json_decref(rows);
    json_decref(keys);
    if (st == MOE_OK && b.failed) st = moe_err_set(err, MOE_ERR_RUNTIME, tsv_path, "out of memory");
    if (st == MOE_OK) st = moe_write_text_file(tsv_path, b.s, NULL, err);
    free(b.s);
    return st;
}

moe_status moe_metrics_write_charts(const moe_metrics_history *h, const char *run_dir,
                                    const char *title, moe_err *err) {
    char svg[4200], jsonl[4200], tsv[4200];
    snprintf(svg, sizeof svg, "%s/loss.svg", run_dir);
    snprintf(jsonl, sizeof jsonl, "%s/metrics.jsonl", run_dir);
    snprintf(tsv, sizeof tsv, "%s/metrics.tsv", run_dir);
    moe_status st = moe_metrics_write_svg(h, svg, title, err);
    return st == MOE_OK ? moe_metrics_write_tsv(jsonl, tsv, err) : st;
}
