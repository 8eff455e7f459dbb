/* tokenize_pool: moe-tokenize -@ N (N >= 2) - one reader thread (tokenize_prefetch.c, with
 * htslib decompression threads), encoder threads that turn whole batches of records into
 * document buffers, and the calling thread writing the buffers in input order.
 *
 * The one thing to know: batch k is encoded into output slot k % n_slots and the writer
 * takes slots strictly in batch order, so the shards are the bytes -@ 1 writes; an encoder
 * waits for its slot to be written before reusing it, which bounds the memory to n_slots
 * buffers. The first error (reader or encoder) in input order ends the run, after the
 * documents before it were written, exactly as with one thread. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "moe/log.h"
#include "tokenize/tokenize_impl.h"
#include "tokenize/tokenize_prefetch.h"

typedef struct slot {
    tok_docbuf buf;
    int64_t seq; /* batch number encoded here, -1 = free */
    int ready;   /* encoded */
    int end;     /* the last batch */
} slot;

typedef struct pool {
    const moe_tokenize_opts *o;
    const moe_tokenizer *tok;
    moe_prefetch *pf;
    pthread_mutex_t mu;
    pthread_cond_t ready_cv, freed_cv; /* the writer waits on ready, encoders on freed slots */
    slot *slots;
    int n_slots;
    int stop;
    /* where the time went (seconds, summed over the encoders; -v prints them) */
    double enc_cpu, enc_wait_in, enc_wait_slot, write_wait, write_busy;
} pool;

/* Encodes batch b (number seq) into its slot; adds the time spent waiting for the slot to
 * *wait. */
static void encode_batch(pool *p, tok_enc *e, moe_prefetch_batch *b, int64_t seq, double *wait) {
    slot *s = &p->slots[seq % p->n_slots];
    double t0 = moe_time_now();
    pthread_mutex_lock(&p->mu);
    while (s->seq != -1 && !p->stop)
        pthread_cond_wait(&p->freed_cv, &p->mu);
    int stop = p->stop;
    if (!stop) s->seq = seq;
    pthread_mutex_unlock(&p->mu);
    *wait += moe_time_now() - t0;
    if (stop) return;
    tok_docbuf *out = &s->buf;
    tok_docbuf_reset(out);
    e->out = out;
    int n = moe_prefetch_batch_size(b), input;
    moe_seq_record rec;
    for (int i = 0; i < n && out->status == MOE_OK; i++) {
        moe_prefetch_batch_record(b, i, &rec, &input);
        out->status = tok_enc_record(e, &rec, input, &out->err);
    }
    moe_err reader_err;
    int end = moe_prefetch_batch_end(b, &out->filtered, &out->empty, &reader_err);
    if (end < 0 && out->status == MOE_OK) {
        out->status = reader_err.status;
        out->err = reader_err;
    }
    pthread_mutex_lock(&p->mu);
    s->ready = 1;
    s->end = end != 0 || out->status != MOE_OK;
    pthread_cond_signal(&p->ready_cv);
    pthread_mutex_unlock(&p->mu);
}

static void *encoder_main(void *arg) {
    pool *p = arg;
    tok_enc e;
    tok_enc_init(&e, p->o, p->tok);
    moe_prefetch_batch *b;
    int64_t seq;
    double wait_in = 0, wait_slot = 0, t0 = moe_time_now();
    while (moe_prefetch_take(p->pf, &b, &seq)) {
        wait_in += moe_time_now() - t0;
        encode_batch(p, &e, b, seq, &wait_slot);
        moe_prefetch_release(p->pf, b);
        t0 = moe_time_now();
    }
    wait_in += moe_time_now() - t0;
    tok_enc_free(&e);
    double cpu = moe_time_thread_cpu();
    pthread_mutex_lock(&p->mu);
    p->enc_cpu += cpu;
    p->enc_wait_in += wait_in;
    p->enc_wait_slot += wait_slot;
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Writes the slots in batch order until the last one or an error. */
static moe_status write_in_order(pool *p, tok_out *out, moe_err *err) {
    for (int64_t seq = 0;; seq++) {
        slot *s = &p->slots[seq % p->n_slots];
        double t0 = moe_time_now();
        pthread_mutex_lock(&p->mu);
        while (!(s->seq == seq && s->ready))
            pthread_cond_wait(&p->ready_cv, &p->mu);
        pthread_mutex_unlock(&p->mu);
        double t1 = moe_time_now();
        moe_status st = tok_out_write(out, &s->buf, err);
        p->write_wait += t1 - t0;
        p->write_busy += moe_time_now() - t1;
        int end = s->end;
        pthread_mutex_lock(&p->mu);
        s->seq = -1;
        s->ready = 0;
        pthread_cond_broadcast(&p->freed_cv); /* encoders wait for different slots */
        pthread_mutex_unlock(&p->mu);
        if (st != MOE_OK || end) return st;
    }
}

/* How -@ N is spent: htslib decompression threads, encoder threads, and the reader thread
   (the writing thread mostly waits for I/O and is not counted). Half of them decompress: at
   -@ 16 on the 16-core GPU host (2026-12-01) a 984 MB FASTA took 2.19 s of CPU to decompress
   (`bgzip -d`) and 1.75 s to decode, tokenize and pack (9 encoders' CPU, from -v; BAM 2.08 s),
   and with 6 decompression threads the encoders waited for input half of the time. */
static void split_threads(int n, int *decompress, int *encoders) {
    *decompress = n / 2 > 1 ? n / 2 : 1;
    *encoders = n - 1 - *decompress > 1 ? n - 1 - *decompress : 1;
}

/* -v: one line saying where the time of the run that started at t0 went (times from t0).
 * The reader's time that is neither CPU nor waiting for a free batch is spent waiting for
 * htslib's threads to decompress (or for the disk). */
static void log_times(const pool *p, int threads, int n_enc, double t0, double t_written,
                      const moe_prefetch_stats *rs) {
    double reader = rs->t_done - rs->t_start, other = reader - rs->cpu - rs->wait_free;
    moe_log_debug("-@ %d times: first batch read at %.3f s, all read at %.3f s, written at %.3f "
                  "s, threads ended at %.3f s; reader %.3f s CPU, %.3f s waiting for a free "
                  "batch, %.3f s for input, %lld batches; %d encoders %.3f s CPU, %.3f s "
                  "waiting for batches, %.3f s for output slots; writer %.3f s writing, %.3f s "
                  "waiting",
                  threads, rs->t_first - t0, rs->t_done - t0, t_written - t0, moe_time_now() - t0,
                  rs->cpu, rs->wait_free, other > 0 ? other : 0, (long long)rs->batches, n_enc,
                  p->enc_cpu, p->enc_wait_in, p->enc_wait_slot, p->write_busy, p->write_wait);
}

moe_status tok_pool_run(const moe_tokenize_opts *o, const moe_tokenizer *tok, tok_out *out,
                        moe_err *err) {
    double t0 = moe_time_now();
    pool p;
    memset(&p, 0, sizeof p);
    p.o = o;
    p.tok = tok;
    int n_dec, n_enc;
    split_threads(o->threads, &n_dec, &n_enc);
    p.n_slots = n_enc + 2;
    moe_seqio_opts io = o->io;
    io.threads = n_dec;
    io.raw = 1;       /* the encoders decode FASTA text and BAM codes, not the reader */
    io.keep_text = 1; /* and find FASTA records in the text as it was read: no copy */
    moe_log_debug("-@ %d: %d decompression, %d encoder threads, a reader and a writer", o->threads,
                  n_dec, n_enc);
    if (!(p.slots = calloc((size_t)p.n_slots, sizeof *p.slots)))
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    for (int i = 0; i < p.n_slots; i++)
        p.slots[i].seq = -1;
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.ready_cv, NULL);
    pthread_cond_init(&p.freed_cv, NULL);
    pthread_t *th = calloc((size_t)n_enc, sizeof *th);
    int started = 0;
    moe_status st = th ? moe_prefetch_start(&p.pf, o->inputs, o->n_inputs, &io, n_enc + 2, err)
                       : moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    while (st == MOE_OK && started < n_enc) {
        if (pthread_create(&th[started], NULL, encoder_main, &p) != 0)
            st = moe_err_set(err, MOE_ERR_RUNTIME, NULL, "cannot start an encoder thread");
        else
            started++;
    }
    if (st == MOE_OK) st = write_in_order(&p, out, err);
    double t_written = moe_time_now();
    if (p.pf) moe_prefetch_stop(p.pf);
    pthread_mutex_lock(&p.mu);
    p.stop = 1;
    pthread_cond_broadcast(&p.freed_cv);
    pthread_mutex_unlock(&p.mu);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    moe_prefetch_stats rs = {0};
    moe_prefetch_finish(p.pf, &rs);
    log_times(&p, o->threads, started, t0, t_written, &rs);
    for (int i = 0; i < p.n_slots; i++)
        tok_docbuf_free(&p.slots[i].buf);
    free(p.slots);
    free(th);
    pthread_mutex_destroy(&p.mu);
    pthread_cond_destroy(&p.ready_cv);
    pthread_cond_destroy(&p.freed_cv);
    return st;
}
