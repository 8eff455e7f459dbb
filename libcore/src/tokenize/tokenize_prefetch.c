/* tokenize_prefetch: the reader thread of moe-tokenize -@ N (N >= 2) - it parses the inputs
 * (seqio; BGZF, BAM and CRAM decompressed by the caller's htslib thread pool) into batches of
 * records and hands each batch, as soon as it is filled, to a callback that queues its
 * encoding while the reader fills the next ones. FASTA records are not copied: the batch
 * takes over the text buffer they were read into (moe_seqio_take_text).
 *
 * The one thing to know: batches are numbered in input order, and each record carries its
 * ordinal over all inputs, so the encoders can work on several at once and the output can
 * still be put back in order. A reader error travels inside the batch where it happened and
 * is reported after the records before it were processed, exactly as without the thread. */
#include "tokenize/tokenize_prefetch.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "moe/log.h"

/* A batch ends after this many bases (FASTA: bytes of text) or records. The last batch is
 * encoded by one thread while the others have nothing left, and the first one must be read
 * before any encoder starts: small batches keep both short (1 MB: about 2 ms of one
 * encoder's work), and give 16 threads enough of them to share (a 200 MB input: 200). */
#define BATCH_BASES ((size_t)1 << 20)
#define BATCH_RECORDS 8192

typedef struct rec_meta {
    size_t name_off, seq_off; /* seq_off: into text when in_text, else into buf */
    int64_t len, src_start, src_end, record_no, line, ordinal;
    char strand;
    int input, raw, in_text;
} rec_meta;

struct moe_prefetch_batch {
    char *buf; /* names, and the bases of records not in text */
    size_t used, cap;
    char *text; /* the FASTA text its records lie in, handed over by the reader (keep_text) */
    size_t text_cap;
    size_t bases; /* of its records (FASTA: bytes of text) */
    rec_meta *recs;
    int n, cap_recs;
    int end;           /* no batch follows */
    moe_status status; /* reader error after the records of this batch */
    moe_err err;
    int64_t filtered, empty; /* counters of inputs finished while filling this batch */
    int full;                /* filled and not yet released */
};
typedef struct moe_prefetch_batch batch;

struct moe_prefetch {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t freed_cv; /* the reader waits on it for its next slot to be released */
    batch *slots;            /* batch number i lives in slot i % n_slots */
    int n_slots;
    int64_t filled; /* batches filled */
    int stop;       /* the consumers gave up */
    int started;
    moe_prefetch_filled_fn on_filled;
    void *on_filled_arg;
    const char *const *inputs;
    int n_inputs;
    moe_seqio_opts io;        /* io.pool: the caller's htslib threads, for all inputs */
    moe_prefetch_stats stats; /* the reader thread's, read after it ended */
};

/* Appends rec; `before` = records of the inputs before its own (see record.ordinal);
 * text_off >= 0: its bases stay in the reader's text at that offset (not copied). */
static int batch_add(batch *b, const moe_seq_record *rec, int input, int64_t before,
                     int64_t text_off) {
    size_t bytes = (size_t)moe_seqio_seq_bytes(rec);
    size_t nl = strlen(rec->name) + 1, copied = text_off >= 0 ? 0 : bytes + 1;
    size_t need = b->used + nl + copied;
    if (need > b->cap) {
        size_t nc = b->cap ? b->cap : BATCH_BASES;
        while (nc < need)
            nc *= 2;
        char *nb = realloc(b->buf, nc);
        if (!nb) return -1;
        b->buf = nb;
        b->cap = nc;
    }
    if (b->n == b->cap_recs) {
        int nc = b->cap_recs ? 2 * b->cap_recs : 256;
        rec_meta *nr = realloc(b->recs, (size_t)nc * sizeof *nr);
        if (!nr) return -1;
        b->recs = nr;
        b->cap_recs = nc;
    }
    rec_meta *m = &b->recs[b->n++];
    m->name_off = b->used;
    memcpy(b->buf + b->used, rec->name, nl);
    b->used += nl;
    m->in_text = text_off >= 0;
    if (m->in_text) {
        m->seq_off = (size_t)text_off;
    } else {
        m->seq_off = b->used;
        memcpy(b->buf + b->used, rec->seq, bytes); /* a raw record's bytes end without a NUL */
        b->buf[b->used + bytes] = '\0';
        b->used += bytes + 1;
    }
    b->bases += (size_t)rec->len;
    m->len = rec->len;
    m->src_start = rec->src_start;
    m->src_end = rec->src_end;
    m->record_no = rec->record_no;
    m->ordinal = rec->ordinal ? rec->ordinal + before : 0;
    m->line = rec->line;
    m->strand = rec->strand;
    m->input = input;
    m->raw = rec->raw;
    return 0;
}

/* Reader state kept across batches. */
typedef struct reader_pos {
    int input;
    moe_seq_reader *r;
    int64_t before; /* records of the inputs before `input` */
} reader_pos;

/* Gives b the text of its records that the open reader kept (the text b held before goes
 * back to the reader). 0, or -1 with b's error set. */
static int take_text(reader_pos *rp, batch *b) {
    char *text;
    size_t cap;
    int ret = moe_seqio_take_text(rp->r, b->text, b->text_cap, &text, &cap, &b->err);
    if (ret < 0) {
        b->status = b->err.status;
        return -1;
    }
    if (ret > 0) { /* b's old text is the reader's now */
        b->text = text;
        b->text_cap = cap;
    }
    return 0;
}

/* Fills b; returns 1 when more batches will follow. A batch holds the kept text of one
 * input at most: it ends with that input. */
static int fill(moe_prefetch *p, reader_pos *rp, batch *b) {
    b->n = 0;
    b->used = b->bases = 0;
    b->end = 0;
    b->status = MOE_OK;
    b->filtered = b->empty = 0;
    moe_err_clear(&b->err);
    while (rp->input < p->n_inputs) {
        if (!rp->r && moe_seqio_open(&rp->r, p->inputs[rp->input], &p->io, &b->err) != MOE_OK) {
            b->status = b->err.status;
            return 0;
        }
        moe_seq_record rec;
        int ret;
        int in_text = 0; /* b holds records in this input's kept text */
        while ((ret = moe_seqio_next(rp->r, &rec, &b->err)) == 1) {
            int64_t off = moe_seqio_text_offset(rp->r, &rec);
            in_text |= off >= 0;
            if (batch_add(b, &rec, rp->input, rp->before, off) < 0) {
                b->status = moe_err_set(&b->err, MOE_ERR_RUNTIME, p->inputs[rp->input],
                                        "out of memory (reader batch)");
                ret = -1;
                break;
            }
            if (b->bases >= BATCH_BASES || b->n >= BATCH_RECORDS)
                return take_text(rp, b) < 0 ? 0 : 1;
        }
        /* the records before an error are still processed: their text comes along */
        if (take_text(rp, b) < 0) return 0;
        if (ret < 0 && b->status != MOE_OK) return 0; /* out of memory above */
        rp->before += moe_seqio_n_kept(rp->r);
        b->filtered += moe_seqio_n_filtered(rp->r);
        b->empty += moe_seqio_n_empty(rp->r);
        moe_seqio_close(rp->r);
        rp->r = NULL;
        if (ret < 0) {
            b->status = b->err.status;
            return 0;
        }
        rp->input++;
        if (in_text) return rp->input < p->n_inputs;
    }
    return 0;
}

static void *reader_main(void *arg) {
    moe_prefetch *p = arg;
    moe_prefetch_stats *st = &p->stats;
    st->t_start = moe_time_now();
    reader_pos rp = {0, NULL, 0};
    for (int more = 1; more;) {
        batch *b = &p->slots[p->filled % p->n_slots];
        double t0 = moe_time_now();
        pthread_mutex_lock(&p->mu);
        while (b->full && !p->stop)
            pthread_cond_wait(&p->freed_cv, &p->mu);
        int stop = p->stop;
        pthread_mutex_unlock(&p->mu);
        st->wait_free += moe_time_now() - t0;
        if (stop) break;
        more = fill(p, &rp, b);
        b->end = !more;
        pthread_mutex_lock(&p->mu);
        b->full = 1;
        int64_t seq = p->filled++;
        pthread_mutex_unlock(&p->mu);
        if (st->batches++ == 0) st->t_first = moe_time_now();
        p->on_filled(p->on_filled_arg, b, seq);
    }
    st->t_done = moe_time_now();
    if (rp.r) moe_seqio_close(rp.r);
    st->cpu = moe_time_thread_cpu();
    return NULL;
}

moe_status moe_prefetch_start(moe_prefetch **out, const char *const *inputs, int n_inputs,
                              const moe_seqio_opts *io, int n_slots, moe_prefetch_filled_fn filled,
                              void *arg, moe_err *err) {
    *out = NULL;
    moe_prefetch *p = calloc(1, sizeof *p);
    if (!p || !(p->slots = calloc((size_t)n_slots, sizeof *p->slots))) {
        free(p);
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    }
    p->n_slots = n_slots;
    p->inputs = inputs;
    p->n_inputs = n_inputs;
    p->io = *io;
    p->on_filled = filled;
    p->on_filled_arg = arg;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->freed_cv, NULL);
    if (pthread_create(&p->thread, NULL, reader_main, p) != 0) {
        moe_prefetch_finish(p, NULL);
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "cannot start the reader thread");
    }
    p->started = 1;
    *out = p;
    return MOE_OK;
}

int moe_prefetch_batch_size(const moe_prefetch_batch *b) {
    return b->n;
}

void moe_prefetch_batch_record(const moe_prefetch_batch *b, int i, moe_seq_record *rec,
                               int *input) {
    const rec_meta *m = &b->recs[i];
    memset(rec, 0, sizeof *rec);
    rec->name = b->buf + m->name_off;
    rec->comment = "";
    rec->seq = (m->in_text ? b->text : b->buf) + m->seq_off;
    rec->len = m->len;
    rec->src_start = m->src_start;
    rec->src_end = m->src_end;
    rec->strand = m->strand;
    rec->record_no = m->record_no;
    rec->ordinal = m->ordinal;
    rec->line = m->line;
    rec->raw = m->raw;
    *input = m->input;
}

int moe_prefetch_batch_end(const moe_prefetch_batch *b, int64_t *filtered, int64_t *empty,
                           moe_err *err) {
    *filtered = b->filtered;
    *empty = b->empty;
    if (b->status != MOE_OK) {
        *err = b->err;
        return -1;
    }
    return b->end;
}

void moe_prefetch_release(moe_prefetch *p, moe_prefetch_batch *b) {
    pthread_mutex_lock(&p->mu);
    b->full = 0;
    pthread_cond_signal(&p->freed_cv);
    pthread_mutex_unlock(&p->mu);
}

void moe_prefetch_stop(moe_prefetch *p) {
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_signal(&p->freed_cv);
    pthread_mutex_unlock(&p->mu);
}

void moe_prefetch_finish(moe_prefetch *p, moe_prefetch_stats *stats) {
    if (!p) return;
    if (p->started) {
        moe_prefetch_stop(p);
        /* a reader waiting for a free slot wakes up and sees stop; one inside fill()
           publishes its batch, then sees stop */
        pthread_join(p->thread, NULL);
    }
    if (stats) *stats = p->stats;
    for (int i = 0; i < p->n_slots; i++) {
        free(p->slots[i].buf);
        free(p->slots[i].text);
        free(p->slots[i].recs);
    }
    free(p->slots);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->freed_cv);
    free(p);
}
