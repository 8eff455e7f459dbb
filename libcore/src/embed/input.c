/* input: the tokenized input of the inference programs (moe-embed, moe-score) - one
 * path (a sequence file, "-", a .mtok shard, a directory of shards or a manifest.json) ->
 * one callback per sequence with its content tokens (and, on request, the tokens of its
 * reverse complement), tokenized with the checkpoint's tokenizer.
 *
 * The one thing to know: only regular files are sniffed for the shard magic (reading a
 * pipe's first bytes would consume them), and a shard must use the checkpoint's tokenizer
 * (same vocabulary hash): its ids are used as they are, with the document's own BOS/EOS
 * stripped so that windows get their own. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "moe/input.h"
#include "moe/shard.h"

typedef struct input_reader {
    const moe_tokenizer *tok;
    int with_rc, nb, ne;
    moe_input_fn fn;
    void *ctx;
    moe_token_buf enc, rcenc;
    char *bases; /* scratch for reverse complements */
    int64_t bases_cap;
} input_reader;

/* Room for need bases in r->bases (path names the input in an out-of-memory error). */
static moe_status grow_bases(input_reader *r, int64_t need, const char *path, moe_err *err) {
    if (need <= r->bases_cap) return MOE_OK;
    char *p = realloc(r->bases, (size_t)need);
    if (!p) return moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory");
    r->bases = p;
    r->bases_cap = need;
    return MOE_OK;
}

/* Tokens of the reverse complement of bases[0, len) into r->rcenc; must be n tokens. */
static moe_status encode_rc(input_reader *r, const char *bases, int64_t len, int64_t n,
                            moe_err *err) {
    if (grow_bases(r, len + 1, NULL, err) != MOE_OK) return err->status;
    if (bases != r->bases) memcpy(r->bases, bases, (size_t)len);
    moe_seqio_revcomp(r->bases, len);
    r->rcenc.n = 0;
    moe_status st = moe_tokenizer_encode(r->tok, r->bases, len, &r->rcenc, err);
    if (st == MOE_OK && r->rcenc.n != n) {
        moe_err_set(err, MOE_ERR_INPUT, NULL,
                    "the reverse complement has %" PRId64 " tokens, the sequence %" PRId64,
                    r->rcenc.n, n);
        moe_err_hint(err, "--rc-average needs tokens that map one-to-one onto bases; "
                          "drop --rc-average for this input");
        st = MOE_ERR_INPUT;
    }
    return st;
}

/* Every record of a sequence file through seqio, tokenized, errors naming the record. */
static moe_status read_seqfile(input_reader *r, const char *path, const moe_seqio_opts *io,
                               moe_err *err) {
    moe_seq_reader *sr;
    moe_status st = moe_seqio_open(&sr, path, io, err);
    if (st != MOE_OK) return st;
    moe_seq_record rec;
    int rc;
    while (st == MOE_OK && (rc = moe_seqio_next(sr, &rec, err)) == 1) {
        r->enc.n = 0;
        st = moe_tokenizer_encode(r->tok, rec.seq, rec.len, &r->enc, err);
        if (st == MOE_OK && r->with_rc) st = encode_rc(r, rec.seq, rec.len, r->enc.n, err);
        if (st != MOE_OK) {
            moe_err_prefix(err, "record %" PRId64 " (%s)", rec.record_no, rec.name);
            if (!err->file[0]) snprintf(err->file, sizeof err->file, "%s", path);
            if (!err->record) moe_err_at_record(err, rec.record_no);
            break;
        }
        moe_input_seq s = {
            rec.name,      rec.len,    r->enc.ids, r->enc.n,  r->with_rc ? r->rcenc.ids : NULL,
            rec.src_start, rec.strand, 0,          r->enc.pos};
        st = r->fn(r->ctx, &s, err);
    }
    if (st == MOE_OK && rc < 0) st = err->status;
    moe_seqio_close(sr);
    return st;
}

/* Every document of an open shard, as one sequence each. */
static moe_status read_shard(input_reader *r, const moe_shard *sh, moe_err *err) {
    const char *path = moe_shard_path(sh);
    const moe_tokenizer *tok = r->tok;
    moe_status st = MOE_OK;
    if (moe_shard_vocab_hash(sh) != tok->vocab_hash) {
        const moe_tokenizer *t = moe_shard_tokenizer(sh);
        moe_err_set(err, MOE_ERR_INPUT, path,
                    "the shard was tokenized with another tokenizer (%s, %" PRId64 " tokens, "
                    "hash %016" PRIx64 ") than the checkpoint's (%s, %" PRId64 " tokens, hash "
                    "%016" PRIx64 ")",
                    t->name, t->vocab_size, moe_shard_vocab_hash(sh), tok->name, tok->vocab_size,
                    tok->vocab_hash);
        moe_err_hint(err, "give the sequences (FASTA/BAM) instead: they are tokenized with the "
                          "checkpoint's own tokenizer");
        return MOE_ERR_INPUT;
    }
    int32_t *ids = NULL;
    uint8_t *lower = NULL;
    int64_t cap = 0;
    int bpt = moe_tokenizer_max_bases_per_token(tok);
    for (int64_t d = 0; st == MOE_OK && d < moe_shard_n_docs(sh); d++) {
        moe_shard_doc doc;
        moe_shard_get_doc(sh, d, &doc);
        if (doc.length > cap) {
            cap = doc.length;
            int32_t *a = realloc(ids, (size_t)cap * sizeof *a);
            if (a) ids = a;
            uint8_t *b = realloc(lower, (size_t)cap);
            if (b) lower = b;
            if (!a || !b) st = moe_err_set(err, MOE_ERR_RUNTIME, path, "out of memory");
        }
        if (st != MOE_OK) break;
        moe_shard_read_tokens(sh, doc.start, doc.length, ids, lower);
        int64_t a = 0, b = doc.length; /* strip the document's own BOS/EOS */
        if (b > a && r->nb && ids[a] == tok->bos_id) a++;
        if (b > a && r->ne && ids[b - 1] == tok->eos_id) b--;
        const int32_t *rc = NULL;
        if (r->with_rc) {
            st = grow_bases(r, (b - a) * bpt + 1, path, err);
            if (st != MOE_OK) break;
            int64_t nb = moe_tokenizer_decode(tok, ids + a, lower + a, b - a, r->bases);
            st = encode_rc(r, r->bases, nb, b - a, err);
            if (st != MOE_OK) {
                moe_err_prefix(err, "document %" PRId64 " (%s)", d + 1, doc.name);
                if (!err->file[0]) snprintf(err->file, sizeof err->file, "%s", path);
                break;
            }
            rc = r->rcenc.ids;
        }
        /* a '-' document holds the reverse complement of its forward range */
        moe_input_seq s = {
            doc.name,   doc.src_end - doc.src_start, ids + a, b - a, rc, doc.src_start,
            doc.strand, doc.strand == '-',           NULL};
        st = r->fn(r->ctx, &s, err);
    }
    free(ids);
    free(lower);
    return st;
}

/* A .mtok file, or (is_set) a directory of shards or a manifest.json as moe-train reads. */
static moe_status read_shards(input_reader *r, const char *path, int is_set, moe_err *err) {
    moe_status st;
    if (!is_set) {
        moe_shard *sh;
        st = moe_shard_open(&sh, path, err);
        if (st != MOE_OK) return st;
        st = read_shard(r, sh, err);
        moe_shard_close(sh);
        return st;
    }
    moe_shardset *set = NULL;
    st = moe_shardset_open(&set, path, err);
    for (int64_t i = 0; st == MOE_OK && i < moe_shardset_n_shards(set); i++)
        st = read_shard(r, moe_shardset_shard(set, i), err);
    if (set) moe_shardset_close(set);
    return st;
}

/* 1: a .mtok file (by its magic), 2: a directory or a manifest.json (a shard set), 0: a
 * sequence file. */
static int is_shard_file(const char *path) {
    struct stat sb;
    size_t len = strlen(path);
    if (strcmp(path, "-") == 0 || stat(path, &sb) != 0) return 0;
    if (S_ISDIR(sb.st_mode) || (len >= 13 && strcmp(path + len - 13, "manifest.json") == 0))
        return 2;
    if (!S_ISREG(sb.st_mode)) return 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) return 0;
    char magic[8];
    int yes = fread(magic, 1, 8, fp) == 8 && memcmp(magic, MOE_SHARD_MAGIC, 8) == 0;
    fclose(fp);
    return yes;
}

moe_status moe_input_check_rc(const moe_tokenizer *tok, moe_err *err) {
    if (moe_tokenizer_max_bases_per_token(tok) == 1) return MOE_OK;
    return moe_err_set(err, MOE_ERR_INPUT, NULL,
                       "--rc-average needs a tokenizer with one base per token (byte, nuc); this "
                       "checkpoint uses '%s'",
                       tok->name);
}

moe_status moe_input_read(const char *path, const moe_seqio_opts *io, const moe_tokenizer *tok,
                          int with_rc, moe_input_fn fn, void *ctx, moe_err *err) {
    input_reader r;
    memset(&r, 0, sizeof r);
    r.tok = tok;
    r.with_rc = with_rc;
    r.enc.want_pos = 1; /* moe_input_seq.pos: where each token's bases lie */
    r.nb = tok->opts.add_bos && tok->bos_id >= 0;
    r.ne = tok->opts.add_eos && tok->eos_id >= 0;
    r.fn = fn;
    r.ctx = ctx;
    moe_status st = with_rc ? moe_input_check_rc(tok, err) : MOE_OK;
    int kind = st == MOE_OK ? is_shard_file(path) : 0;
    if (st == MOE_OK)
        st = kind ? read_shards(&r, path, kind == 2, err) : read_seqfile(&r, path, io, err);
    moe_token_buf_free(&r.enc);
    moe_token_buf_free(&r.rcenc);
    free(r.bases);
    return st;
}
