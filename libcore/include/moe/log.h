/* log: leveled messages and progress reporting on stderr.
 *
 * The log level is the one piece of global mutable state in libcore (tools set it from
 * -q/-v once at start-up). Messages go to stderr as "[HH:MM:SS] prog: level: text"; data
 * never goes through here. A progress reporter draws a bar with rate and ETA when stderr
 * is a terminal, and prints a plain line every `interval` seconds otherwise (logs, CI). */
#ifndef MOE_LOG_H
#define MOE_LOG_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum moe_log_level {
    MOE_LOG_ERROR = 0,
    MOE_LOG_WARN = 1,
    MOE_LOG_INFO = 2, /* default */
    MOE_LOG_DEBUG = 3,
} moe_log_level;

void moe_log_init(const char *prog, moe_log_level level);
moe_log_level moe_log_get_level(void);
void moe_log(moe_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void moe_log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void moe_log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void moe_log_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Monotonic wall clock in seconds. */
double moe_time_now(void);
/* CPU seconds the calling thread has used. */
double moe_time_thread_cpu(void);
/* The wall-clock time now as ISO-8601 UTC with milliseconds ("2026-12-01T10:12:03.250Z")
 * into buf [n >= 25]. */
void moe_time_iso8601(char *buf, size_t n);

typedef struct moe_progress {
    const char *label; /* "tokenize", "train", ... */
    const char *unit;  /* "bases", "tokens", ... */
    int64_t total;     /* 0 when unknown: no bar, no ETA */
    int64_t done;
    double start, last_draw;
    double interval; /* seconds between plain lines when not a TTY */
    int tty;         /* draw a bar (stderr is a terminal and level >= INFO) */
    int enabled;     /* 0 under -q */
} moe_progress;

void moe_progress_start(moe_progress *p, const char *label, const char *unit, int64_t total);
/* Sets the amount done; draws when due. `extra` (may be NULL) is appended, e.g. "loss 2.31". */
void moe_progress_update(moe_progress *p, int64_t done, const char *extra);
/* Final line with the total and the mean rate. */
void moe_progress_finish(moe_progress *p, const char *extra);

#ifdef __cplusplus
}
#endif

#endif
