/* fileio: see moe/fileio.h. */
#include "moe/fileio.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#ifdef MOE_HAVE_LIBDEFLATE
#include <libdeflate.h>
#endif

/* An errno error the user can fix (missing input, unwritable directory). */
static moe_status input_errno(moe_err *err, const char *file, const char *what) {
    int fresh = err && err->status == MOE_OK; /* the first error wins, status included */
    moe_err_errno(err, file, what);
    if (fresh) err->status = MOE_ERR_INPUT;
    return MOE_ERR_INPUT;
}

/* Where a rename for path must go: path itself, or the target of the symlink(s) it names
 * (followed while dangling too, so "-o link" creates the link's target). Returns a malloc'ed
 * string, NULL when out of memory or the chain is too long (errno set). */
static char *out_resolve(const char *path) {
    char *cur = strdup(path);
    for (int hops = 0; cur && hops < 40; hops++) {
        struct stat st;
        if (lstat(cur, &st) != 0 || !S_ISLNK(st.st_mode)) return cur;
        char *real = realpath(cur, NULL);
        if (real) { /* the whole chain resolves: done */
            free(cur);
            return real;
        }
        char link[4096];
        ssize_t n = readlink(cur, link, sizeof link - 1);
        if (n < 0) break;
        link[n] = '\0';
        const char *slash = strrchr(cur, '/');
        size_t dirlen = link[0] == '/' || !slash ? 0 : (size_t)(slash - cur + 1);
        char *next = malloc(dirlen + (size_t)n + 1);
        if (!next) break;
        memcpy(next, cur, dirlen);
        memcpy(next + dirlen, link, (size_t)n + 1);
        free(cur);
        cur = next;
    }
    free(cur);
    if (errno == 0) errno = ELOOP;
    return NULL;
}

/* ---- temporary names a signal handler removes (moe_outfile_cleanup_on_signals) ----
 * A slot is filled, then marked used; the handler reads only used slots, with unlink(2),
 * which is async-signal-safe. The mutex orders threads that open outputs at once. */
#define TMP_SLOTS 64
static char tmp_slot_path[TMP_SLOTS][4352];
static volatile sig_atomic_t tmp_slot_used[TMP_SLOTS];
static pthread_mutex_t tmp_slot_lock = PTHREAD_MUTEX_INITIALIZER;

static void tmp_slots_add(const char *tmp) {
    if (strlen(tmp) >= sizeof tmp_slot_path[0]) return; /* not removed by a signal: rare */
    pthread_mutex_lock(&tmp_slot_lock);
    for (int i = 0; i < TMP_SLOTS; i++) {
        if (tmp_slot_used[i]) continue;
        strcpy(tmp_slot_path[i], tmp);
        tmp_slot_used[i] = 1;
        break;
    }
    pthread_mutex_unlock(&tmp_slot_lock);
}

static void tmp_slots_remove(const char *tmp) {
    pthread_mutex_lock(&tmp_slot_lock);
    for (int i = 0; i < TMP_SLOTS; i++)
        if (tmp_slot_used[i] && strcmp(tmp_slot_path[i], tmp) == 0) {
            tmp_slot_used[i] = 0;
            break;
        }
    pthread_mutex_unlock(&tmp_slot_lock);
}

static void on_fatal_signal(int signo) {
    for (int i = 0; i < TMP_SLOTS; i++)
        if (tmp_slot_used[i]) unlink(tmp_slot_path[i]);
    signal(signo, SIG_DFL);
    raise(signo);
}

moe_status moe_outfile_cleanup_on_signals(moe_err *err) {
    const int sigs[3] = {SIGTERM, SIGINT, SIGHUP};
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fatal_signal;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 3; i++)
        if (sigaction(sigs[i], &sa, NULL) != 0)
            return moe_err_errno(err, NULL, "cannot install signal handlers");
    return MOE_OK;
}

static void outfile_free(moe_outfile *f) {
    if (f->tmp) tmp_slots_remove(f->tmp);
    free(f->tmp);
    free(f->dest);
    free(f->path);
    memset(f, 0, sizeof *f);
}

/* The start both opens share: f cleared, path copied; "-" is stdout. Returns 1 when that is
 * all (stdout), 0 to go on, -1 when out of memory (err set). */
static int outfile_begin(moe_outfile *f, const char *path, moe_err *err) {
    memset(f, 0, sizeof *f);
    f->path = strdup(path);
    if (!f->path) {
        moe_err_errno(err, path, "out of memory");
        return -1;
    }
    if (strcmp(path, "-") != 0) return 0;
    f->fp = stdout;
    return 1;
}

moe_status moe_outfile_open(moe_outfile *f, const char *path, moe_err *err) {
    int begun = outfile_begin(f, path, err);
    if (begun) return begun < 0 ? MOE_ERR_RUNTIME : MOE_OK;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        moe_err_set(err, MOE_ERR_INPUT, path, "is a directory, expected an output file name");
        outfile_free(f);
        return MOE_ERR_INPUT;
    }
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) { /* device, FIFO, socket: in place */
        f->special = 1;
        f->fp = fopen(path, "wb");
        if (!f->fp) {
            input_errno(err, path, "cannot open output");
            outfile_free(f);
            return MOE_ERR_INPUT;
        }
        return MOE_OK;
    }
    f->dest = out_resolve(path);
    if (!f->dest) {
        input_errno(err, path, "cannot resolve the output's symlink");
        outfile_free(f);
        return MOE_ERR_INPUT;
    }
    const char *slash = strrchr(f->dest, '/');
    size_t dirlen = slash ? (size_t)(slash - f->dest + 1) : 0;
    size_t n = strlen(f->dest) + 64;
    f->tmp = malloc(n);
    if (!f->tmp) {
        outfile_free(f);
        return moe_err_errno(err, path, "out of memory");
    }
    snprintf(f->tmp, n, "%.*s.%s.tmp.%ld", (int)dirlen, f->dest, f->dest + dirlen, (long)getpid());
    f->fp = fopen(f->tmp, "wb");
    if (!f->fp) {
        input_errno(err, path, "cannot create output file");
        moe_err_hint(err, "check that the directory exists and is writable");
        outfile_free(f);
        return MOE_ERR_INPUT;
    }
    tmp_slots_add(f->tmp);
    return MOE_OK;
}

moe_status moe_outfile_open_append(moe_outfile *f, const char *path, moe_err *err) {
    int begun = outfile_begin(f, path, err);
    if (begun) return begun < 0 ? MOE_ERR_RUNTIME : MOE_OK;
    struct stat st;
    f->special = stat(path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode);
    f->fp = fopen(path, "ab");
    if (!f->fp) {
        input_errno(err, path, "cannot open for appending");
        moe_err_hint(err, "check that the directory exists and is writable");
        outfile_free(f);
        return MOE_ERR_INPUT;
    }
    return MOE_OK;
}

moe_status moe_outfile_write(moe_outfile *f, const void *data, size_t n, moe_err *err) {
    if (n && fwrite(data, 1, n, f->fp) != n) return moe_err_errno(err, f->path, "write failed");
    return MOE_OK;
}

moe_status moe_outfile_flush(moe_outfile *f, moe_err *err) {
    return fflush(f->fp) == 0 ? MOE_OK : moe_err_errno(err, f->path, "write failed");
}

moe_status moe_outfile_commit(moe_outfile *f, moe_err *err) {
    moe_status st = MOE_OK;
    if (fflush(f->fp) != 0) st = moe_err_errno(err, f->path, "write failed");
    /* fsync only what will be renamed: a device or pipe has nothing durable to sync */
    if (st == MOE_OK && f->tmp && fsync(fileno(f->fp)) != 0)
        st = moe_err_errno(err, f->path, "write failed");
    if (f->fp != stdout && fclose(f->fp) != 0 && st == MOE_OK)
        st = moe_err_errno(err, f->path, "write failed");
    f->fp = NULL;
    if (f->tmp) {
        if (st == MOE_OK && rename(f->tmp, f->dest) != 0)
            st = moe_err_errno(err, f->path, "cannot rename temporary file into place");
        if (st != MOE_OK) unlink(f->tmp);
    }
    outfile_free(f);
    return st;
}

void moe_outfile_abort(moe_outfile *f) {
    if (f->fp && f->fp != stdout) fclose(f->fp);
    if (f->tmp) unlink(f->tmp);
    outfile_free(f);
}

moe_status moe_write_text_file(const char *path, const char *text, const char *tail, moe_err *err) {
    moe_outfile f;
    moe_status st = moe_outfile_open(&f, path, err);
    if (st != MOE_OK) return st;
    st = moe_outfile_write(&f, text, strlen(text), err);
    if (st == MOE_OK && tail) st = moe_outfile_write(&f, tail, strlen(tail), err);
    if (st == MOE_OK) return moe_outfile_commit(&f, err);
    moe_outfile_abort(&f);
    return st;
}

moe_status moe_dirlock_take(moe_dirlock *l, const char *dir, const char *prog, moe_err *err) {
    char path[4200], who[512] = "", host[256] = "?";
    l->fd = -1;
    if (snprintf(path, sizeof path, "%s/.lock", dir) >= (int)sizeof path)
        return moe_err_set(err, MOE_ERR_INPUT, dir, "path too long");
    int fd;
    struct stat a, b;
    for (;;) { /* a lock on a file that its holder unlinked as we opened it locks nothing */
        fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) return input_errno(err, path, "cannot create the lock file");
        if (flock(fd, LOCK_EX | LOCK_NB) != 0 || fstat(fd, &a) != 0 || stat(path, &b) != 0 ||
            (a.st_dev == b.st_dev && a.st_ino == b.st_ino))
            break;
        close(fd);
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        ssize_t n = e == EWOULDBLOCK ? pread(fd, who, sizeof who - 1, 0) : -1;
        close(fd);
        if (e != EWOULDBLOCK) {
            errno = e;
            return input_errno(err, path, "cannot lock");
        }
        who[n > 0 ? n : 0] = '\0';
        char holder[64] = "another program", hhost[256] = "?";
        long pid = 0;
        if (sscanf(who, "%63s %255s %ld", holder, hhost, &pid) != 3) pid = 0;
        moe_err_set(err, MOE_ERR_INPUT, dir, "in use by %s on host %s, pid %ld (%s is locked)",
                    holder, hhost, pid, path);
        moe_err_hint(err, "two runs in one directory overwrite each other's files: wait for it "
                          "to end, or choose another output directory");
        return MOE_ERR_INPUT;
    }
    gethostname(host, sizeof host - 1);
    int n = snprintf(who, sizeof who, "%s %s %ld\n", prog, host, (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, who, (size_t)n, 0) != n) {
        moe_err_errno(err, path, "cannot write the lock file");
        close(fd);
        return MOE_ERR_RUNTIME;
    }
    l->fd = fd;
    snprintf(l->path, sizeof l->path, "%s", path);
    return MOE_OK;
}

void moe_dirlock_release(moe_dirlock *l) {
    if (l->fd < 0) return;
    unlink(l->path); /* while still holding it: see the retry in moe_dirlock_take */
    close(l->fd);
    l->fd = -1;
}

moe_status moe_mkdirs(const char *path, moe_err *err) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return moe_err_set(err, MOE_ERR_INPUT, path, "path too long");
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
            return input_errno(err, buf, "cannot create directory");
        }
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
        return input_errno(err, buf, "cannot create directory");
    }
    struct stat st;
    if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode))
        return moe_err_set(err, MOE_ERR_INPUT, path, "exists and is not a directory");
    return MOE_OK;
}

moe_status moe_fsync_dir(const char *path, moe_err *err) {
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return moe_err_errno(err, path, "cannot open directory");
    int rc = fsync(fd);
    close(fd);
    return rc == 0 ? MOE_OK : moe_err_errno(err, path, "fsync failed");
}

moe_status moe_remove_tree(const char *path, moe_err *err) {
    if (!path[0] || strcmp(path, "/") == 0)
        return moe_err_set(err, MOE_ERR_RUNTIME, path, "refusing to remove this path");
    struct stat top; /* lstat: a symlink is removed itself, its target is never entered */
    if (lstat(path, &top) != 0)
        return errno == ENOENT ? MOE_OK : moe_err_errno(err, path, "cannot stat");
    if (!S_ISDIR(top.st_mode))
        return unlink(path) == 0 ? MOE_OK : moe_err_errno(err, path, "cannot remove");
    DIR *d = opendir(path);
    if (!d) return moe_err_errno(err, path, "cannot open directory");
    moe_status st = MOE_OK;
    struct dirent *e;
    while (st == MOE_OK && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char child[4096];
        snprintf(child, sizeof child, "%s/%s", path, e->d_name);
        struct stat sb;
        if (lstat(child, &sb) == 0 && S_ISDIR(sb.st_mode))
            st = moe_remove_tree(child, err);
        else if (unlink(child) != 0)
            st = moe_err_errno(err, child, "cannot remove");
    }
    closedir(d);
    if (st == MOE_OK && rmdir(path) != 0) st = moe_err_errno(err, path, "cannot remove directory");
    return st;
}

moe_status moe_read_file(const char *path, char **data, size_t *len, moe_err *err) {
    *data = NULL;
    *len = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        return input_errno(err, path, "cannot open");
    }
    moe_status st = moe_read_stream(fp, path, data, len, err);
    fclose(fp);
    return st;
}

moe_status moe_read_stream(FILE *fp, const char *name, char **data, size_t *len, moe_err *err) {
    *data = NULL;
    *len = 0;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n - 1, fp);
        n += got;
        if (got == 0) break;
        if (cap - n - 1 == 0) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    if (!buf) return moe_err_set(err, MOE_ERR_RUNTIME, name, "out of memory");
    if (ferror(fp)) {
        free(buf);
        return moe_err_errno(err, name, "read failed");
    }
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return MOE_OK;
}

uint32_t moe_crc32(uint32_t crc, const void *data, size_t n) {
#ifdef MOE_HAVE_LIBDEFLATE
    return libdeflate_crc32(crc, data, n); /* the same CRC, ~2x faster (docs/performance.md) */
#else
    const unsigned char *p = data;
    while (n > 0) { /* zlib takes uInt lengths */
        uInt chunk = n > (1u << 30) ? (1u << 30) : (uInt)n;
        crc = (uint32_t)crc32(crc, p, chunk);
        p += chunk;
        n -= chunk;
    }
    return crc;
#endif
}

/* CRC32 of bytes [off, off + len) of fd, read in 1 MiB blocks; -1 when a read fails. */
static int64_t crc32_range(int fd, uint64_t off, uint64_t len) {
    static const size_t bufsz = 1 << 20;
    unsigned char *buf = malloc(bufsz);
    if (!buf) return -1;
    uint32_t c = 0;
    while (len > 0) {
        size_t want = len < bufsz ? (size_t)len : bufsz;
        ssize_t got = pread(fd, buf, want, (off_t)off);
        if (got <= 0) {
            free(buf);
            return -1;
        }
        c = moe_crc32(c, buf, (size_t)got);
        off += (uint64_t)got;
        len -= (uint64_t)got;
    }
    free(buf);
    return c;
}

/* Checkpoints are tens of GB: segments of CRC_SEGMENT bytes are summed on all threads and
 * combined in order (crc32_combine), so the result is the sequential CRC. */
#define CRC_SEGMENT (32u << 20)

moe_status moe_crc32_file(const char *path, uint32_t *crc, uint64_t *size, moe_err *err) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return moe_err_errno(err, path, "cannot open");
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return moe_err_set(err, MOE_ERR_RUNTIME, path, "not a regular file");
    }
    uint64_t n = (uint64_t)sb.st_size;
    int64_t nseg = (int64_t)((n + CRC_SEGMENT - 1) / CRC_SEGMENT);
    int64_t *part = malloc((size_t)(nseg ? nseg : 1) * sizeof *part);
    if (!part) {
        close(fd);
        return moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory");
    }
#pragma omp parallel for schedule(dynamic, 1) if (nseg > 1)
    for (int64_t s = 0; s < nseg; s++) {
        uint64_t off = (uint64_t)s * CRC_SEGMENT;
        part[s] = crc32_range(fd, off, n - off < CRC_SEGMENT ? n - off : CRC_SEGMENT);
    }
    close(fd);
    uLong c = 0;
    int bad = 0;
    for (int64_t s = 0; s < nseg && !bad; s++) {
        uint64_t off = (uint64_t)s * CRC_SEGMENT;
        bad = part[s] < 0;
        c = s == 0 ? (uLong)part[s]
                   : crc32_combine(c, (uLong)part[s],
                                   (z_off_t)(n - off < CRC_SEGMENT ? n - off : CRC_SEGMENT));
    }
    free(part);
    if (bad)
        return moe_err_set(err, MOE_ERR_RUNTIME, path, "read failed (file changed or I/O error)");
    *crc = (uint32_t)c;
    *size = n;
    return MOE_OK;
}
