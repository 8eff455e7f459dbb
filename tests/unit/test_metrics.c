/* test_metrics: axis ticks, metrics.jsonl truncation on resume (later steps dropped, a torn
 * last line tolerated, a damaged line refused with its line number) and the SVG chart's
 * parts (both curves, markers, ticks, labels, legend). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe/fileio.h"
#include "moe/metrics.h"
#include "testlib.h"

static void write_text(const char *path, const char *text) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return;
    fputs(text, fp);
    fclose(fp);
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

int main(void) {
    double f, s;
    int c;
    moe_metrics_ticks(0, 100, &f, &s, &c);
    CHECK(f == 0 && s == 20 && c == 6);
    moe_metrics_ticks(1.37, 5.61, &f, &s, &c);
    CHECK_NEAR(s, 1.0, 1e-12);
    CHECK_NEAR(f, 2.0, 1e-12);
    CHECK_INT_EQ(c, 4);
    moe_metrics_ticks(3, 3, &f, &s, &c); /* degenerate range still gives ticks */
    CHECK(c >= 1 && s > 0);

    moe_err err;
    moe_err_clear(&err);
    moe_metrics_history h;
    moe_metrics_history_init(&h);
    write_text("m.jsonl", "{\"step\":1,\"bits_per_base\":5.5,\"lr\":0.1}\n"
                          "{\"step\":2,\"bits_per_base\":5.0,\"val_bits_per_base\":5.2}\n"
                          "{\"step\":3,\"bits_per_base\":4.0}\n"
                          "{\"step\":4,\"lo");
    CHECK(moe_metrics_jsonl_truncate("m.jsonl", 2, &h, &err) == MOE_OK);
    CHECK_INT_EQ(h.n, 2);
    if (h.n == 2) {
        CHECK(h.pts[0].step == 1 && h.pts[0].bpb == 5.5 && isnan(h.pts[0].val_bpb));
        CHECK(h.pts[1].val_bpb == 5.2);
    }
    char *text;
    size_t len;
    CHECK(moe_read_file("m.jsonl", &text, &len, &err) == MOE_OK);
    if (text)
        CHECK(strcmp(text, "{\"step\":1,\"bits_per_base\":5.5,\"lr\":0.1}\n"
                           "{\"step\":2,\"bits_per_base\":5.0,\"val_bits_per_base\":5.2}\n") == 0);
    free(text);
    /* metrics.tsv: every key in order of first appearance, a missing one left empty */
    write_text("t.jsonl",
               "{\"step\":1,\"loss\":5.5,\"load\":[1.5,2],\"time\":\"2026-12-01T10:00:00Z\"}\n"
               "{\"step\":2,\"loss\":5,\"val_loss\":5.25,\"time\":\"x\"}\n");
    CHECK(moe_metrics_write_tsv("t.jsonl", "t.tsv", &err) == MOE_OK);
    CHECK(moe_read_file("t.tsv", &text, &len, &err) == MOE_OK);
    if (text)
        CHECK(strcmp(text, "step\tloss\tload\ttime\tval_loss\n"
                           "1\t5.5\t1.5,2\t2026-12-01T10:00:00Z\t\n"
                           "2\t5\t\tx\t5.25\n") == 0);
    free(text);
    write_text("bad.jsonl", "{\"step\":1}\nnot json\n");
    CHECK(moe_metrics_write_tsv("bad.jsonl", "bad.tsv", &err) == MOE_ERR_INPUT && err.line == 2);
    CHECK(access("bad.tsv", F_OK) != 0);
    moe_err_clear(&err);
    write_text("bad.jsonl", "{\"step\":1}\nnot json\n{\"step\":2}\n");
    moe_err_clear(&err);
    moe_metrics_history h2;
    moe_metrics_history_init(&h2);
    CHECK(moe_metrics_jsonl_truncate("bad.jsonl", 5, &h2, &err) == MOE_ERR_INPUT);
    moe_metrics_history_free(&h2);
    CHECK(err.line == 2 && strstr(err.file, "bad.jsonl"));
    moe_err_clear(&err);
    CHECK(moe_metrics_jsonl_truncate("missing.jsonl", 5, &h, &err) == MOE_OK);
    CHECK(access("missing.jsonl", F_OK) != 0);

    /* Adding to the last step merges; new steps append. */
    CHECK(moe_metrics_history_add(&h, 2, NAN, 4.9, &err) == MOE_OK);
    CHECK(h.n == 2 && h.pts[1].val_bpb == 4.9 && h.pts[1].bpb == 5.0);
    for (int i = 3; i <= 50; i++) /* 5 down to 0.25 bits per base: over a decade */
        moe_metrics_history_add(&h, i, 5.0 / (1 + 0.4 * i), i % 10 == 0 ? 5.2 / (1 + 0.4 * i) : NAN,
                                &err);
    CHECK(moe_metrics_write_svg(&h, "loss.svg", "tiny <run>", &err) == MOE_OK);
    CHECK(moe_read_file("loss.svg", &text, &len, &err) == MOE_OK);
    if (text) {
        CHECK(strncmp(text, "<svg xmlns=\"http://www.w3.org/2000/svg\"", 39) == 0);
        CHECK(strstr(text, "</svg>\n") != NULL);
        CHECK_INT_EQ(count(text, "<polyline"), 2);
        CHECK_INT_EQ(count(text, "<circle"), 6 + 1); /* 6 evaluations + the legend marker */
        CHECK(strstr(text, "tiny &lt;run&gt;") != NULL);
        CHECK(strstr(text, ">step<") && strstr(text, "cross-entropy (bits per base, log scale)"));
        CHECK(strstr(text, ">train<") && strstr(text, ">validation<"));
        /* log scale: 1-2-5 ticks per decade (a linear axis would label 0 1 2 3 4 5) */
        CHECK(strstr(text, ">0.5<") && strstr(text, ">2<") && strstr(text, ">5<"));
        CHECK(strstr(text, ">3<") == NULL && strstr(text, ">4<") == NULL);
        CHECK(strstr(text, ">50<") != NULL); /* an x tick label at the last step */
    }
    free(text);
    moe_metrics_history_free(&h);
    /* An empty history still gives a valid chart (axes and legend). */
    moe_metrics_history_init(&h);
    CHECK(moe_metrics_write_svg(&h, "empty.svg", "empty", &err) == MOE_OK);
    moe_metrics_history_free(&h);
    return test_summary("metrics");
}
