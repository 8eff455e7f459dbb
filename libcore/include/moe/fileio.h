/* fileio: output files that appear under their final name only when complete.
 *
 * Every file a tool writes (shards, checkpoints, embeddings, metrics) goes through
 * moe_outfile. A regular file (or a new path) is written to "<dir>/.<name>.tmp.<pid>", and
 * moe_outfile_commit() flushes, fsyncs and renames it into place; moe_outfile_abort() (or any
 * failure) removes the temporary file, so an interrupted run never leaves a half-written file
 * under the final name. A symlink is followed: the rename replaces its target, never the
 * link. An existing character or block device, FIFO or socket (/dev/null, /dev/stdout, a
 * named pipe) is written in place and never replaced, like "-" (stdout): such an output is
 * streamed (f->tmp is NULL, so it cannot be patched by seeking). Every write, flush and
 * close is checked: /dev/full fails with ENOSPC. Also here: directory helpers and CRC32. */
#ifndef MOE_FILEIO_H
#define MOE_FILEIO_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "moe/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct moe_outfile {
    FILE *fp;
    char *path;  /* the name given ("-" for stdout), used in messages */
    char *dest;  /* where the rename goes: path, or a symlink's resolved target */
    char *tmp;   /* temporary name, NULL when written in place (stdout, device, FIFO, append) */
    int special; /* 1: an existing device, FIFO or socket, written in place (not "-") */
} moe_outfile;

/* Opens an output as described above. A directory, or a path whose directory is missing or
 * not writable, is MOE_ERR_INPUT. */
moe_status moe_outfile_open(moe_outfile *f, const char *path, moe_err *err);
/* Opens path for appending in place (a log such as metrics.jsonl: earlier lines stay; a
 * symlink is followed and a device or FIFO written as it is); commit flushes and closes. */
moe_status moe_outfile_open_append(moe_outfile *f, const char *path, moe_err *err);
/* fwrite that records a failure in err (MOE_ERR_RUNTIME naming the file). */
moe_status moe_outfile_write(moe_outfile *f, const void *data, size_t n, moe_err *err);
/* fflush, checked: what was written so far reaches the file (or fails naming it). */
moe_status moe_outfile_flush(moe_outfile *f, moe_err *err);
moe_status moe_outfile_commit(moe_outfile *f, moe_err *err);
void moe_outfile_abort(moe_outfile *f);

/* Makes SIGTERM, SIGINT and SIGHUP remove the temporary files of every open moe_outfile
 * before the process ends by that signal as it would have (exit status 128 + signal), so a
 * killed tool leaves no ".x.tmp.PID" behind. For the tools that do not stop cleanly on
 * their own (moe-train's loop has its own handlers). The open temporary names are kept in
 * a process-wide table for the handler: fileio's one piece of global state. */
moe_status moe_outfile_cleanup_on_signals(moe_err *err);

/* Writes text, then tail (may be NULL, e.g. "\n" after a JSON dump), to path through a
 * moe_outfile: the whole file appears under its name at once or not at all. */
moe_status moe_write_text_file(const char *path, const char *text, const char *tail, moe_err *err);

/* An exclusive lock on "<dir>/.lock" (flock, so the kernel drops it when the process ends,
 * kill -9 included): one run per run directory or shard directory. The file holds
 * "<prog> <host> <pid>" of the holder and is removed by release (after kill -9 it stays,
 * unlocked). Held by someone else: MOE_ERR_INPUT naming them. Set fd = -1 before use. */
typedef struct moe_dirlock {
    int fd;          /* -1 when not held */
    char path[4200]; /* <dir>/.lock */
} moe_dirlock;
moe_status moe_dirlock_take(moe_dirlock *l, const char *dir, const char *prog, moe_err *err);
void moe_dirlock_release(moe_dirlock *l);

/* mkdir -p; an existing directory is fine. */
moe_status moe_mkdirs(const char *path, moe_err *err);
/* fsync a directory so that a rename inside it is durable. */
moe_status moe_fsync_dir(const char *path, moe_err *err);
/* rm -rf of a directory this program created (refuses "/" and ""). */
moe_status moe_remove_tree(const char *path, moe_err *err);
/* Reads a whole file into a malloc'ed buffer (NUL-terminated; *len excludes the NUL). */
moe_status moe_read_file(const char *path, char **data, size_t *len, moe_err *err);
/* The same for an open stream up to its end (stdin, a pipe); `name` names it in errors. */
moe_status moe_read_stream(FILE *fp, const char *name, char **data, size_t *len, moe_err *err);

/* CRC-32 (zlib polynomial) of a buffer, continuing from crc (start with 0). */
uint32_t moe_crc32(uint32_t crc, const void *data, size_t n);
/* CRC-32 and size of a regular file. Large files are read in 32 MiB segments on all OpenMP
 * threads and the segment CRCs combined in order: the same value as one sequential pass. */
moe_status moe_crc32_file(const char *path, uint32_t *crc, uint64_t *size, moe_err *err);

#ifdef __cplusplus
}
#endif

#endif
