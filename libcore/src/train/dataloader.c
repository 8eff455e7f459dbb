/* dataloader: see moe/dataloader.h. The stream is never materialised: a window is located
 * by binary search over shard starts (and, when separators are inserted, over documents),
 * then copied with moe_shard_read_tokens. */
#include "moe/dataloader.h"

#include <stdlib.h>
#include <string.h>

#include "moe/rng.h"

/* Feistel round function: Philox keyed by the seed, counter (half-block, round, epoch). */
static uint64_t round_fn(uint64_t r, uint32_t round, uint64_t epoch, uint64_t seed) {
    uint32_t ctr[4] = {(uint32_t)r, (uint32_t)(r >> 32), round, (uint32_t)epoch};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, out[4];
    moe_philox4x32_10(ctr, key, out);
    return (uint64_t)out[0] | ((uint64_t)out[1] << 32);
}

/* A bijection of [0, n): a 4-round balanced Feistel network on the smallest even number of
 * bits covering n, cycle-walked until the value falls inside [0, n). */
static int64_t feistel_perm(int64_t i, int64_t n, uint64_t epoch, uint64_t seed) {
    int bits = 2;
    while (bits < 62 && ((int64_t)1 << bits) < n)
        bits += 2;
    int half = bits / 2;
    uint64_t mask = ((uint64_t)1 << half) - 1, x = (uint64_t)i;
    do {
        uint64_t l = x >> half, r = x & mask;
        for (uint32_t round = 0; round < 4; round++) {
            uint64_t f = round_fn(r, round, epoch, seed) & mask;
            uint64_t nl = r;
            r = l ^ f;
            l = nl;
        }
        x = (l << half) | r;
    } while (x >= (uint64_t)n);
    return (int64_t)x;
}

int64_t moe_dataloader_sample_at(const moe_dataloader *dl, int64_t epoch, int64_t index) {
    if (!dl->shuffle) return index;
    return feistel_perm(index, dl->n_samples, (uint64_t)epoch, dl->seed);
}

moe_status moe_dataloader_check_vocab(const moe_shardset *set, const char *path,
                                      int64_t model_vocab, moe_err *err) {
    const moe_tokenizer *t = moe_shardset_tokenizer(set);
    if (t->vocab_size == model_vocab) return MOE_OK;
    moe_err_set(err, MOE_ERR_INPUT, path,
                "the data was tokenized with tokenizer '%s' of vocabulary size %lld, but the "
                "model has model.vocab_size=%lld",
                t->name, (long long)t->vocab_size, (long long)model_vocab);
    moe_err_hint(err,
                 "set model.vocab_size=%lld (on the command line or in the config), or "
                 "re-tokenize the data with a matching tokenizer",
                 (long long)t->vocab_size);
    return MOE_ERR_INPUT;
}

moe_status moe_dataloader_init(moe_dataloader *dl, const moe_shardset *set, int64_t seq_len,
                               int shuffle, uint64_t seed, double lowercase_weight,
                               const char *what, moe_err *err) {
    memset(dl, 0, sizeof *dl);
    dl->set = set;
    dl->seq_len = seq_len;
    dl->shuffle = shuffle;
    dl->seed = seed;
    dl->lowercase_weight = (float)lowercase_weight;
    const moe_tokenizer *tok = moe_shardset_tokenizer(set);
    dl->sep_id = (!tok->opts.add_eos && tok->eos_id >= 0) ? tok->eos_id : -1;
    dl->pad_id = tok->pad_id;
    dl->doc_sep = -1;
    dl->n_shards = moe_shardset_n_shards(set);
    dl->shard_vstart = malloc((size_t)(dl->n_shards + 1) * sizeof *dl->shard_vstart);
    dl->win = malloc((size_t)(seq_len + 1) * sizeof *dl->win);
    dl->win_lower = malloc((size_t)(seq_len + 1));
    if (!dl->shard_vstart || !dl->win || !dl->win_lower) {
        moe_dataloader_free(dl);
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    }
    int any_mask = 0;
    int64_t v = 0;
    for (int64_t s = 0; s < dl->n_shards; s++) {
        const moe_shard *sh = moe_shardset_shard(set, s);
        dl->shard_vstart[s] = v;
        v += moe_shard_n_tokens(sh) + (dl->sep_id >= 0 ? moe_shard_n_docs(sh) : 0);
        any_mask |= moe_shard_has_mask(sh);
    }
    dl->shard_vstart[dl->n_shards] = v;
    dl->stream_tokens = v;
    dl->use_weights = any_mask && dl->lowercase_weight != 1.0f;
    if (v < seq_len + 1) {
        const char *path = dl->n_shards ? moe_shard_path(moe_shardset_shard(set, 0)) : NULL;
        moe_err_set(err, MOE_ERR_INPUT, path,
                    "%s has %lld tokens, fewer than one sample of train.seq_len + 1 = %lld", what,
                    (long long)v, (long long)(seq_len + 1));
        moe_err_hint(err, "use more data or a smaller train.seq_len");
        moe_dataloader_free(dl);
        return MOE_ERR_INPUT;
    }
    dl->n_samples = (v - 1) / seq_len;
    return MOE_OK;
}

void moe_dataloader_set_document_mask(moe_dataloader *dl, int on) {
    dl->doc_sep = on ? moe_shardset_tokenizer(dl->set)->eos_id : -1;
}

void moe_dataloader_free(moe_dataloader *dl) {
    free(dl->shard_vstart);
    free(dl->win);
    free(dl->win_lower);
    memset(dl, 0, sizeof *dl);
}

/* Copies stream tokens [v, v + n) into ids/lower. */
static void read_stream(const moe_dataloader *dl, int64_t v, int64_t n, int32_t *ids,
                        uint8_t *lower) {
    int64_t lo = 0, hi = dl->n_shards - 1;
    while (lo < hi) { /* last shard with vstart <= v */
        int64_t mid = (lo + hi + 1) / 2;
        if (dl->shard_vstart[mid] <= v)
            lo = mid;
        else
            hi = mid - 1;
    }
    int64_t s = lo;
    while (n > 0) {
        const moe_shard *sh = moe_shardset_shard(dl->set, s);
        int64_t local = v - dl->shard_vstart[s], in_shard = dl->shard_vstart[s + 1] - v;
        if (in_shard <= 0) {
            s++;
            continue;
        }
        if (dl->sep_id < 0) {
            int64_t m = n < in_shard ? n : in_shard;
            moe_shard_read_tokens(sh, local, m, ids, lower);
            ids += m, lower += m, v += m, n -= m;
            continue;
        }
        /* Separators inserted: document d occupies [start_d + d, start_d + d + len_d] of the
         * shard's part of the stream, its last position being the separator. */
        int64_t dlo = 0, dhi = moe_shard_n_docs(sh) - 1;
        moe_shard_doc doc;
        while (dlo < dhi) {
            int64_t mid = (dlo + dhi + 1) / 2;
            moe_shard_get_doc(sh, mid, &doc);
            if (doc.start + mid <= local)
                dlo = mid;
            else
                dhi = mid - 1;
        }
        moe_shard_get_doc(sh, dlo, &doc);
        int64_t off = local - (doc.start + dlo);
        if (off < doc.length) {
            int64_t m = doc.length - off < n ? doc.length - off : n;
            moe_shard_read_tokens(sh, doc.start + off, m, ids, lower);
            ids += m, lower += m, v += m, n -= m;
        } else {
            *ids++ = dl->sep_id;
            *lower++ = 0;
            v++, n--;
        }
    }
}

void moe_dataloader_get(moe_dataloader *dl, int64_t sample, int32_t *tokens, int32_t *targets,
                        float *weights) {
    int64_t T = dl->seq_len;
    read_stream(dl, sample * T, T + 1, dl->win, dl->win_lower);
    memcpy(tokens, dl->win, (size_t)T * sizeof *tokens);
    for (int64_t t = 0; t < T; t++) {
        int32_t y = dl->win[t + 1];
        int ignored =
            (dl->pad_id >= 0 && y == dl->pad_id) || (dl->doc_sep >= 0 && dl->win[t] == dl->doc_sep);
        targets[t] = ignored ? -1 : y;
        if (weights)
            weights[t] = (dl->use_weights && dl->win_lower[t + 1]) ? dl->lowercase_weight : 1.0f;
    }
}

/* The position of the next sample, advancing past it (a new epoch when one is done). */
static int64_t advance(moe_dataloader *dl) {
    if (dl->index >= dl->n_samples) {
        dl->epoch++;
        dl->index = 0;
    }
    return dl->index++;
}

void moe_dataloader_next(moe_dataloader *dl, int64_t B, int32_t *tokens, int32_t *targets,
                         float *weights) {
    int64_t T = dl->seq_len;
    for (int64_t b = 0; b < B; b++) {
        int64_t at = advance(dl); /* may start the next epoch */
        int64_t sample = moe_dataloader_sample_at(dl, dl->epoch, at);
        moe_dataloader_get(dl, sample, tokens + b * T, targets + b * T,
                           weights ? weights + b * T : NULL);
    }
}

void moe_dataloader_skip(moe_dataloader *dl, int64_t B) {
    for (int64_t b = 0; b < B; b++)
        advance(dl);
}

void moe_dataloader_position(const moe_dataloader *dl, int64_t *epoch, int64_t *index) {
    *epoch = dl->epoch;
    *index = dl->index;
}

moe_status moe_dataloader_set_position(moe_dataloader *dl, int64_t epoch, int64_t index,
                                       moe_err *err) {
    if (epoch < 0 || index < 0 || index > dl->n_samples)
        return moe_err_set(err, MOE_ERR_INPUT, NULL,
                           "data position epoch %lld sample %lld is outside the data "
                           "(%lld samples per epoch)",
                           (long long)epoch, (long long)index, (long long)dl->n_samples);
    dl->epoch = epoch;
    dl->index = index;
    return MOE_OK;
}
