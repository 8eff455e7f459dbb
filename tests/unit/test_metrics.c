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
    write_text("m.jsonl", "{\"step\":1,\"loss\":5.5,\"lr\":0.1}\n"
                          "{\"step\":2,\"loss\":5.0,\"val_loss\":5.2}\n"
                          "{\"step\":3,\"loss\":4.0}\n"
                          "{\"step\":4,\"lo");
    CHECK(moe_metrics_jsonl_truncate("m.jsonl", 2, &h, &err) == MOE_OK);
    CHECK_INT_EQ(h.n, 2);
    if (h.n == 2) {
        CHECK(h.pts[0].step == 1 && h.pts[0].loss == 5.5 && isnan(h.pts[0].val_loss));
        CHECK(h.pts[1].val_loss == 5.2);
    }
    char *text;
    size_t len;
    CHECK(moe_read_file("m.jsonl", &text, &len, &err) == MOE_OK);
    if (text)
        CHECK(strcmp(text, "{\"step\":1,\"loss\":5.5,\"lr\":0.1}\n"
                           "{\"step\":2,\"loss\":5.0,\"val_loss\":5.2}\n") == 0);
    free(text);
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
    CHECK(h.n == 2 && h.pts[1].val_loss == 4.9 && h.pts[1].loss == 5.0);
    for (int i = 3; i <= 50; i++)
        moe_metrics_history_add(&h, i, 5.0 - 0.05 * i, i % 10 == 0 ? 5.1 - 0.05 * i : NAN, &err);
    CHECK(moe_metrics_write_svg(&h, "loss.svg", "tiny <run>", &err) == MOE_OK);
    CHECK(moe_read_file("loss.svg", &text, &len, &err) == MOE_OK);
    if (text) {
        CHECK(strncmp(text, "<svg xmlns=\"http://www.w3.org/2000/svg\"", 39) == 0);
        CHECK(strstr(text, "</svg>\n") != NULL);
        CHECK_INT_EQ(count(text, "<polyline"), 2);
        CHECK_INT_EQ(count(text, "<circle"), 6 + 1); /* 6 evaluations + the legend marker */
        CHECK(strstr(text, "tiny &lt;run&gt;") != NULL);
        CHECK(strstr(text, ">step<") && strstr(text, "loss (nats per token)"));
        CHECK(strstr(text, ">train loss<") && strstr(text, ">validation loss<"));
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
