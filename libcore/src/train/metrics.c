/* metrics: see moe/metrics.h. The SVG is plain text assembled here (no library): a plot
 * area with a light grid, x ticks in steps, y ticks in nats, two polylines and a legend. */
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

moe_status moe_metrics_history_add(moe_metrics_history *h, int64_t step, double loss,
                                   double val_loss, moe_err *err) {
    if (h->n > 0 && h->pts[h->n - 1].step == step) {
        moe_metrics_point *p = &h->pts[h->n - 1];
        if (!isnan(loss)) p->loss = loss;
        if (!isnan(val_loss)) p->val_loss = val_loss;
        return MOE_OK;
    }
    if (h->n == h->cap) {
        int64_t cap = h->cap ? 2 * h->cap : 256;
        moe_metrics_point *p = realloc(h->pts, (size_t)cap * sizeof *p);
        if (!p) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
        h->pts = p;
        h->cap = cap;
    }
    h->pts[h->n++] = (moe_metrics_point){step, loss, val_loss};
    return MOE_OK;
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
    for (char *p = text, *nl; st == MOE_OK && *p; p = nl ? nl + 1 : p + strlen(p)) {
        nl = strchr(p, '\n');
        if (nl) *nl = '\0';
        line++;
        if (!*p) continue;
        json_error_t jerr;
        json_t *o = json_loads(p, 0, &jerr);
        json_t *js = o ? json_object_get(o, "step") : NULL;
        if (!json_is_object(o) || !json_is_integer(js)) {
            json_decref(o);
            if (!nl) break; /* a torn last line from a crash: drop it */
            st = moe_err_set(err, MOE_ERR_INPUT, path,
                             "expected a JSON object with an integer \"step\"");
            moe_err_at_line(err, line, 0);
            moe_err_hint(err, "move the damaged metrics.jsonl away and resume again");
            break;
        }
        int64_t step = json_integer_value(js);
        if (step <= max_step) {
            json_t *jl = json_object_get(o, "loss"), *jv = json_object_get(o, "val_loss");
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

moe_status moe_metrics_write_svg(const moe_metrics_history *h, const char *path, const char *title,
                                 moe_err *err) {
    const double W = 760, H = 440, ml = 70, mr = 20, mt = 40, mb = 55;
    const double pw = W - ml - mr, ph = H - mt - mb;
    double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
    int64_t n_train = 0, n_val = 0;
    for (int64_t i = 0; i < h->n; i++) {
        const moe_metrics_point *p = &h->pts[i];
        int has_t = isfinite(p->loss), has_v = isfinite(p->val_loss);
        if (!has_t && !has_v) continue;
        xmin = fmin(xmin, (double)p->step);
        xmax = fmax(xmax, (double)p->step);
        if (has_t) {
            ymin = fmin(ymin, p->loss);
            ymax = fmax(ymax, p->loss);
            n_train++;
        }
        if (has_v) {
            ymin = fmin(ymin, p->val_loss);
            ymax = fmax(ymax, p->val_loss);
            n_val++;
        }
    }
    if (n_train + n_val == 0) xmin = 0, xmax = 1, ymin = 0, ymax = 1;
    double xf, xs, yf, ys;
    int xc, yc;
    moe_metrics_ticks(ymin, ymax, &yf, &ys, &yc);
    /* x spans the steps; y is widened to whole tick intervals around the curves. */
    double x0 = xmin, x1 = xmax > xmin ? xmax : xmin + 1;
    double y0 = floor(ymin / ys + 1e-9) * ys, y1 = ceil(ymax / ys - 1e-9) * ys;
    if (y1 <= y0) y1 = y0 + ys;
    yf = y0;
    yc = (int)lround((y1 - y0) / ys) + 1;
    moe_metrics_ticks(x0, x1, &xf, &xs, &xc);
#define SX(v) (ml + ((v)-x0) / (x1 - x0) * pw)
#define SY(v) (mt + ph - ((v)-y0) / (y1 - y0) * ph)
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
    for (int i = 0; i < yc; i++) {
        double v = yf + i * ys;
        if (v < y0 || v > y1) continue;
        put(&b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", ml, SY(v), ml + pw,
            SY(v));
    }
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
        double v = yf + i * ys;
        char t[32];
        if (v < y0 || v > y1) continue;
        fmt_tick(t, sizeof t, v, ys);
        put(&b,
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>"
            "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n",
            ml - 5, SY(v), ml, SY(v), ml - 8, SY(v) + 4, t);
    }
    put(&b, "</g>\n<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n", ml + pw / 2,
        H - 12);
    put(&b,
        "<text x=\"16\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 16 %.1f)\">"
        "loss (nats per token)</text>\n",
        mt + ph / 2, mt + ph / 2);
    if (n_train > 0) {
        put(&b, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"");
        for (int64_t i = 0; i < h->n; i++)
            if (isfinite(h->pts[i].loss))
                put(&b, "%.1f,%.1f ", SX((double)h->pts[i].step), SY(h->pts[i].loss));
        put(&b, "\"/>\n");
    }
    if (n_val > 0) {
        put(&b, "<polyline fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\" points=\"");
        for (int64_t i = 0; i < h->n; i++)
            if (isfinite(h->pts[i].val_loss))
                put(&b, "%.1f,%.1f ", SX((double)h->pts[i].step), SY(h->pts[i].val_loss));
        put(&b, "\"/>\n<g fill=\"#d62728\">\n");
        for (int64_t i = 0; i < h->n; i++)
            if (isfinite(h->pts[i].val_loss))
                put(&b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\"/>\n", SX((double)h->pts[i].step),
                    SY(h->pts[i].val_loss));
        put(&b, "</g>\n");
    }
    double lx = ml + pw - 150, ly = mt + 12;
    put(&b,
        "<g>\n<rect x=\"%.1f\" y=\"%.1f\" width=\"140\" height=\"44\" fill=\"white\" "
        "stroke=\"#999\"/>\n",
        lx, ly - 4);
    put(&b,
        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#1f77b4\" "
        "stroke-width=\"1.5\"/><text x=\"%.1f\" y=\"%.1f\">train loss</text>\n",
        lx + 8, ly + 10, lx + 32, ly + 10, lx + 40, ly + 14);
    put(&b,
        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#d62728\" "
        "stroke-width=\"2\"/><circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"#d62728\"/>"
        "<text x=\"%.1f\" y=\"%.1f\">validation loss</text>\n</g>\n",
        lx + 8, ly + 28, lx + 32, ly + 28, lx + 20, ly + 28, lx + 40, ly + 32);
    put(&b, "</svg>\n");
#undef SX
#undef SY
    if (b.failed) {
        free(b.s);
        return moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory");
    }
    moe_outfile out;
    moe_status st = moe_outfile_open(&out, path, err);
    if (st == MOE_OK) {
        st = moe_outfile_write(&out, b.s, b.n, err);
        if (st == MOE_OK)
            st = moe_outfile_commit(&out, err);
        else
            moe_outfile_abort(&out);
    }
    free(b.s);
    return st;
}
