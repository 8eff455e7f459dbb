/* log: see moe/log.h. */
#include "moe/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static moe_log_level g_level = MOE_LOG_INFO;
static const char *g_prog = "moe";

void moe_log_init(const char *prog, moe_log_level level) {
    g_prog = prog;
    g_level = level;
}

moe_log_level moe_log_get_level(void) {
    return g_level;
}

static void vlog(moe_log_level level, const char *fmt, va_list ap) {
    static const char *names[] = {"error", "warning", "info", "debug"};
    if (level > g_level) return;
    time_t t = time(NULL);
    struct tm tm;
    localtime_r(&t, &tm);
    fprintf(stderr, "[%02d:%02d:%02d] %s: %s: ", tm.tm_hour, tm.tm_min, tm.tm_sec, g_prog,
            names[level]);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

void moe_log(moe_log_level level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlog(level, fmt, ap);
    va_end(ap);
}

void moe_log_warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlog(MOE_LOG_WARN, fmt, ap);
    va_end(ap);
}

void moe_log_info(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlog(MOE_LOG_INFO, fmt, ap);
    va_end(ap);
}

void moe_log_debug(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlog(MOE_LOG_DEBUG, fmt, ap);
    va_end(ap);
}

double moe_time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double moe_time_thread_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void moe_time_iso8601(char *buf, size_t n) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char day[24];
    strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf, n, "%s.%03dZ", day, (int)(ts.tv_nsec / 1000000));
}

/* Rates and counts in engineering units: 1234567 -> "1.23M". */
static void human(char *buf, size_t n, double v) {
    const char *suffix[] = {"", "k", "M", "G", "T"};
    int i = 0;
    while (v >= 1000.0 && i < 4) {
        v /= 1000.0;
        i++;
    }
    snprintf(buf, n, i ? "%.2f%s" : "%.0f%s", v, suffix[i]);
}

void moe_progress_start(moe_progress *p, const char *label, const char *unit, int64_t total) {
    p->label = label;
    p->unit = unit;
    p->total = total;
    p->done = 0;
    p->start = p->last_draw = moe_time_now();
    p->interval = 10.0;
    p->enabled = g_level >= MOE_LOG_INFO;
    p->tty = p->enabled && isatty(STDERR_FILENO);
}

static void draw(moe_progress *p, double now, const char *extra, int final) {
    double elapsed = now - p->start;
    double rate = elapsed > 0 ? (double)p->done / elapsed : 0.0;
    char done[32], tot[32], r[32];
    human(done, sizeof done, (double)p->done);
    human(tot, sizeof tot, (double)p->total);
    human(r, sizeof r, rate);
    if (p->tty && !final) {
        char bar[31] = {0};
        double frac = p->total > 0 ? (double)p->done / (double)p->total : 0.0;
        if (frac > 1.0) frac = 1.0;
        for (int i = 0; i < 30; i++)
            bar[i] = i < (int)(frac * 30.0) ? '#' : '.';
        double eta = rate > 0 && p->total > 0 ? (double)(p->total - p->done) / rate : 0.0;
        fprintf(stderr, "\r%s [%s] %s/%s %s %s/s ETA %.0fs %s\033[K", p->label, bar, done, tot,
                p->unit, r, eta, extra ? extra : "");
        return;
    }
    if (p->tty) fputs("\r\033[K", stderr);
    /* plain lines (cluster logs): a UTC date first, and the time left while it is known */
    char date[32], eta[48] = "";
    moe_time_iso8601(date, sizeof date);
    date[19] = 0; /* to the second */
    if (!final && p->total > 0 && rate > 0 && p->done <= p->total) {
        double left = (double)(p->total - p->done) / rate;
        long s = (long)(left + 0.5);
        if (s >= 3600)
            snprintf(eta, sizeof eta, ", ETA %ldh%02ldm", s / 3600, s / 60 % 60);
        else if (s >= 60)
            snprintf(eta, sizeof eta, ", ETA %ldm%02lds", s / 60, s % 60);
        else
            snprintf(eta, sizeof eta, ", ETA %lds", s);
    }
    if (p->total > 0)
        fprintf(stderr, "[%sZ] %s: %s/%s %s (%.0f%%), %s %s/s, %.1fs%s%s%s\n", date, p->label, done,
                tot, p->unit, 100.0 * (double)p->done / (double)p->total, r, p->unit, elapsed, eta,
                extra ? ", " : "", extra ? extra : "");
    else
        fprintf(stderr, "[%sZ] %s: %s %s, %s %s/s, %.1fs%s%s\n", date, p->label, done, p->unit, r,
                p->unit, elapsed, extra ? ", " : "", extra ? extra : "");
}

void moe_progress_update(moe_progress *p, int64_t done, const char *extra) {
    p->done = done;
    if (!p->enabled) return;
    double now = moe_time_now();
    double every = p->tty ? 0.2 : p->interval;
    if (now - p->last_draw < every) return;
    p->last_draw = now;
    draw(p, now, extra, 0);
}

void moe_progress_finish(moe_progress *p, const char *extra) {
    if (!p->enabled) return;
    draw(p, moe_time_now(), extra, 1);
}
