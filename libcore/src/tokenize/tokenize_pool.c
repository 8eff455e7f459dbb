/* tokenize_pool: moe-tokenize -@ N (N >= 2) - one reader thread (tokenize_prefetch.c) that
 * parses the inputs into batches of records, one htslib thread pool of N - 1 workers that
 * both decompress the inputs (BGZF, BAM, CRAM) and encode whole batches into document
 * buffers, and the calling thread writing the buffers in input order.
 *
 * The one thing to know: each batch is one job of the pool's encoding queue, whose results
 * come back strictly in the order the reader queued them, so the shards are the bytes -@ 1
 * writes. Decompression and encoding share the same workers: a worker takes whichever work
 * has room (htslib's scheduler), so neither stage idles while the other is short of threads,
 * whatever the mix of the input. The reader's ring of batches bounds the jobs in flight (a
 * batch goes back to the reader once its documents are written). The first error (reader or
 * encoder) in input order ends the run, after the documents before it were written, exactly
 * as with one thread. */
#include <htslib/thread_pool.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moe/log.h"
#include "tokenize/tokenize_impl.h"
#include "tokenize/tokenize_prefetch.h"

/* The encoding of one batch: the reader's batch and the documents made of it. Batch seq uses
 * job seq % n_slots, which is free again once the batch that used it before was written. */
typedef struct job {
    struct pool *p;
    moe_prefetch_batch *b;
    tok_docbuf buf;
    int end; /* the last batch, or one with an error: nothing after it is written */
} job;

typedef struct pool {
    const moe_tokenize_opts *o;
    const moe_tokenizer *tok;
    moe_prefetch *pf;
    hts_tpool *tp;
    hts_tpool_process *encq; /* encoding jobs, results in batch order */
    job *jobs;
    int n_slots;
    pthread_mutex_t mu;
    int stop;      /* the writer is done: queue nothing more, encode nothing more */
    tok_enc *encs; /* one per worker; a job takes a free one */
    int *free_encs, n_free;
    /* where the time went (seconds; -v prints them) */
    double enc_cpu, write_wait, write_busy;
} pool;

/* Encodes job j's batch into j->buf with an encoder state of its own (a job runs on one of
 * the pool's workers; at most that many run at once, so one is always free). */
static void *encode_job(void *arg) {
    job *j = arg;
    pool *p = j->p;
    double c0 = moe_time_thread_cpu();
    pthread_mutex_lock(&p->mu);
    int stop = p->stop, ei = stop ? -1 : p->free_encs[--p->n_free];
    pthread_mutex_unlock(&p->mu);
    tok_docbuf *out = &j->buf;
    tok_docbuf_reset(out);
    if (stop) { /* the run ended: the writer discards this */
        j->end = 1;
        return j;
    }
    tok_enc *e = &p->encs[ei];
    e->out = out;
    int n = moe_prefetch_batch_size(j->b), input;
    moe_seq_record rec;
    for (int i = 0; i < n && out->status == MOE_OK; i++) {
        moe_prefetch_batch_record(j->b, i, &rec, &input);
        out->status = tok_enc_record(e, &rec, input, &out->err);
    }
    moe_err reader_err;
    int end = moe_prefetch_batch_end(j->b, &out->filtered, &out->empty, &reader_err);
    if (end < 0 && out->status == MOE_OK) {
        out->status = reader_err.status;
        out->err = reader_err;
    }
    j->end = end != 0 || out->status != MOE_OK;
    double cpu = moe_time_thread_cpu() - c0;
    pthread_mutex_lock(&p->mu);
    p->free_encs[p->n_free++] = ei;
    p->enc_cpu += cpu;
    pthread_mutex_unlock(&p->mu);
    return j;
}

/* The reader's callback: queues the encoding of batch seq, never waiting (the reader's ring
 * of batches bounds the queue). When a job cannot be queued (out of memory) the queue is
 * shut down, which ends the writer's wait with an error. */
static void queue_batch(void *arg, moe_prefetch_batch *b, int64_t seq) {
    pool *p = arg;
    job *j = &p->jobs[seq % p->n_slots];
    j->p = p;
    j->b = b;
    pthread_mutex_lock(&p->mu);
    if (!p->stop && hts_tpool_dispatch2(p->tp, p->encq, encode_job, j, -1) != 0)
        hts_tpool_process_shutdown(p->encq);
    pthread_mutex_unlock(&p->mu);
}

/* Writes the encoded batches in order until the last one or an error. */
static moe_status write_in_order(pool *p, tok_out *out, moe_err *err) {
    for (;;) {
        double t0 = moe_time_now();
        hts_tpool_result *r = hts_tpool_next_result_wait(p->encq);
        double t1 = moe_time_now();
        p->write_wait += t1 - t0;
        if (!r) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory (encoding queue)");
        job *j = hts_tpool_result_data(r);
        hts_tpool_delete_result(r, 0);
        moe_status st = tok_out_write(out, &j->buf, err);
        p->write_busy += moe_time_now() - t1;
        int end = j->end;
        moe_prefetch_release(p->pf, j->b);
        if (st != MOE_OK || end) return st;
    }
}

/* BGZF blocks (64 KB of text each) decompressed ahead of the reader, per worker: at -@ 16,
   15 MB, about 4 ms of the reader's work, so that the reader finds its input decompressed
   while every worker is busy with a batch (1 Mbase, about 2 ms of one worker's work). */
#define TOK_READ_AHEAD 16

/* How -@ N is spent: N - 1 workers that decompress and encode (at least 2, so that -@ 2 still
   overlaps the two), and the reader; the writing thread mostly waits for I/O and is not
   counted. One pool for both: at -@ 16 on the 16-core GPU host (2026-12-01), with 8
   decompression and 7 encoder threads, the encoders waited for input 1.3 of their 3.4
   thread-seconds while the reader waited for decompressed blocks 0.22 s of a 0.48 s run. */
static int pool_workers(int n) {
    return n - 1 > 2 ? n - 1 : 2;
}

static double process_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* -v: one line saying where the time of the run that started at t0 (c0 s of process CPU)
 * went (times from t0). The reader's time that is neither CPU nor waiting for a free batch
 * is spent waiting for the workers to decompress (or for the disk); the workers' CPU that
 * is not encoding is decompressing (and the pool's hand-overs). */
static void log_times(const pool *p, int threads, int n_workers, double t0, double c0,
                      double t_written, const moe_prefetch_stats *rs) {
    double reader = rs->t_done - rs->t_start, other = reader - rs->cpu - rs->wait_free;
    double all = process_cpu() - c0, dec = all - rs->cpu - p->enc_cpu - p->write_busy;
    moe_log_debug("-@ %d times: first batch read at %.3f s, all read at %.3f s, written at %.3f "
                  "s, threads ended at %.3f s; reader %.3f s CPU, %.3f s waiting for a free "
                  "batch, %.3f s for input, %lld batches; %d workers %.3f s CPU encoding, "
                  "%.3f s decompressing and handing over; writer %.3f s writing, %.3f s "
                  "waiting; %.3f s CPU in all",
                  threads, rs->t_first - t0, rs->t_done - t0, t_written - t0, moe_time_now() - t0,
                  rs->cpu, rs->wait_free, other > 0 ? other : 0, (long long)rs->batches, n_workers,
                  p->enc_cpu, dec > 0 ? dec : 0, p->write_busy, p->write_wait, all);
}

/* Frees what pool_open made (p->pf is already finished). */
static void pool_free(pool *p, int n_workers) {
    if (p->encq) hts_tpool_process_destroy(p->encq);
    if (p->tp) hts_tpool_destroy(p->tp);
    for (int i = 0; p->jobs && i < p->n_slots; i++)
        tok_docbuf_free(&p->jobs[i].buf);
    for (int i = 0; p->encs && i < n_workers; i++)
        tok_enc_free(&p->encs[i]);
    free(p->jobs);
    free(p->encs);
    free(p->free_encs);
    pthread_mutex_destroy(&p->mu);
}

/* Sets up p for n_workers workers and n_slots batches: the thread pool, its encoding queue
 * and an encoder state per worker. */
static moe_status pool_open(pool *p, int n_workers, moe_err *err) {
    pthread_mutex_init(&p->mu, NULL);
    p->jobs = calloc((size_t)p->n_slots, sizeof *p->jobs);
    p->encs = calloc((size_t)n_workers, sizeof *p->encs);
    p->free_encs = calloc((size_t)n_workers, sizeof *p->free_encs);
    if (!p->jobs || !p->encs || !p->free_encs)
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    for (int i = 0; i < n_workers; i++) {
        tok_enc_init(&p->encs[i], p->o, p->tok);
        p->free_encs[p->n_free++] = i;
    }
    if (!(p->tp = hts_tpool_init(n_workers)))
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "cannot start the worker threads");
    /* htslib's workers start a job of a queue only while its running and finished-but-untaken
       jobs are fewer than the queue's size: with one fewer than the workers, a worker is
       always left for decompressing what the reader reads next (the reader is the one
       sequential stage: it must not wait while every worker encodes). queue_batch adds its
       jobs past that size, never waiting. */
    if (!(p->encq = hts_tpool_process_init(p->tp, n_workers - 1, 0)))
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "cannot start the encoding queue");
    return MOE_OK;
}

moe_status tok_pool_run(const moe_tokenize_opts *o, const moe_tokenizer *tok, tok_out *out,
                        moe_err *err) {
    double t0 = moe_time_now(), c0 = process_cpu();
    pool p;
    memset(&p, 0, sizeof p);
    p.o = o;
    p.tok = tok;
    int n_workers = pool_workers(o->threads);
    /* batches in flight: one per worker, and as many again queued so none waits for the
       reader; a batch holds about 1 Mbase, so this is a few MB per worker */
    p.n_slots = 2 * n_workers + 2;
    moe_log_debug("-@ %d: %d workers (decompressing and encoding), a reader and a writer",
                  o->threads, n_workers);
    moe_status st = pool_open(&p, n_workers, err);
    moe_seqio_opts io = o->io;
    io.threads = n_workers;
    io.pool = p.tp; /* one pool for every input, started once */
    io.read_ahead = TOK_READ_AHEAD * n_workers;
    io.raw = 1;       /* the encoders decode FASTA text and BAM codes, not the reader */
    io.keep_text = 1; /* and find FASTA records in the text as it was read: no copy */
    if (st == MOE_OK)
        st =
            moe_prefetch_start(&p.pf, o->inputs, o->n_inputs, &io, p.n_slots, queue_batch, &p, err);
    if (st == MOE_OK) st = write_in_order(&p, out, err);
    double t_written = moe_time_now();
    pthread_mutex_lock(&p.mu);
    p.stop = 1; /* nothing more is queued; queued jobs do no work */
    pthread_mutex_unlock(&p.mu);
    if (p.pf) moe_prefetch_stop(p.pf);
    /* the jobs still queued or running end before the reader's batches are freed, and the
       reader (which closes its inputs, detaching them from the pool) before the pool */
    if (p.encq) hts_tpool_process_flush(p.encq);
    moe_prefetch_stats rs = {0};
    if (p.pf) moe_prefetch_finish(p.pf, &rs);
    if (p.pf) log_times(&p, o->threads, n_workers, t0, c0, t_written, &rs);
    pool_free(&p, n_workers);
    return st;
}
