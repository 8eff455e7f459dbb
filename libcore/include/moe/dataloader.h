/* dataloader: training samples from a set of token shards.
 *
 * The documents of all shards, in order, form one token stream (documents already end with
 * EOS when the tokenizer adds it; otherwise an EOS token is inserted after each document).
 * The stream is cut into fixed windows: sample i holds stream tokens [i*T, i*T + T + 1),
 * inputs are its first T tokens and targets the last T (each token is a target exactly once
 * per epoch). Each epoch visits every window once, in an order that is a pseudo-random
 * permutation keyed by (seed, epoch) - a Feistel network over the window index with
 * Philox (moe/rng.h) as round function, so it costs no memory and any position can be jumped to.
 * The one thing to know: the position is just (epoch, index into the epoch's order); saving and
 * restoring those two numbers resumes the sample sequence exactly.
 *
 * Targets that are the tokenizer's PAD are ignored (-1). When the shards carry a lower-case
 * mask, a target from lower-case (soft-masked) bases gets weight lowercase_weight. Under a
 * document mask (train.document_mask, moe_dataloader_set_document_mask) the target of an EOS
 * position - the next document's first token, which the masked model cannot see coming -
 * is ignored too, so a packed row's loss is the sum of its documents' losses alone. */
#ifndef MOE_DATALOADER_H
#define MOE_DATALOADER_H

#include <stdint.h>

#include "moe/err.h"
#include "moe/shard.h"

typedef struct moe_dataloader {
    const moe_shardset *set; /* borrowed: must outlive the loader */
    int64_t seq_len;         /* T */
    int32_t sep_id;          /* EOS inserted after each document, -1: none (docs carry it) */
    int32_t pad_id;          /* targets equal to it are ignored; -1: none */
    int32_t doc_sep;         /* document mask: the EOS ending every document (the target of
                                its positions is ignored); -1: off (the default) */
    float lowercase_weight;
    int use_weights; /* shards carry a mask and lowercase_weight != 1 */
    int shuffle;
    uint64_t seed;
    int64_t n_shards;
    int64_t *shard_vstart; /* [n_shards + 1] start of each shard in the stream */
    int64_t stream_tokens; /* length of the stream */
    int64_t n_samples;     /* windows per epoch */
    int64_t epoch, index;  /* position: the next sample is order(epoch)[index] */
    int32_t *win;          /* [T + 1] scratch */
    uint8_t *win_lower;    /* [T + 1] scratch */
} moe_dataloader;

/* Prepares a loader over set for windows of seq_len + 1 tokens. `what` names the data in
 * errors ("training data"). Fewer than seq_len + 1 tokens is MOE_ERR_INPUT. */
moe_status moe_dataloader_init(moe_dataloader *dl, const moe_shardset *set, int64_t seq_len,
                               int shuffle, uint64_t seed, double lowercase_weight,
                               const char *what, moe_err *err);
void moe_dataloader_free(moe_dataloader *dl);

/* Turns the document mask on (on = 1) or off: on, doc_sep becomes the tokenizer's EOS, which
 * ends every document of the stream (the model takes the same id, moe_model_set_document_
 * separator) and the targets at EOS positions are -1. */
void moe_dataloader_set_document_mask(moe_dataloader *dl, int on);

/* Index of the window at position `index` of epoch `epoch` (a permutation of
 * [0, n_samples) for each epoch; the identity when not shuffling). */
int64_t moe_dataloader_sample_at(const moe_dataloader *dl, int64_t epoch, int64_t index);

/* Fills window `sample` into tokens [T], targets [T] (-1 = ignored) and weights [T] (may be
 * NULL; 1 or lowercase_weight). */
void moe_dataloader_get(moe_dataloader *dl, int64_t sample, int32_t *tokens, int32_t *targets,
                        float *weights);

/* The next B samples (advancing the position, starting a new epoch when one is done):
 * tokens/targets [B, T], weights [B, T] or NULL. */
void moe_dataloader_next(moe_dataloader *dl, int64_t B, int32_t *tokens, int32_t *targets,
                         float *weights);

/* Advances the position past the next B samples as moe_dataloader_next would, reading
 * none (another rank's micro-batch). */
void moe_dataloader_skip(moe_dataloader *dl, int64_t B);

/* Position for checkpoints. set_position refuses an index outside [0, n_samples]. */
void moe_dataloader_position(const moe_dataloader *dl, int64_t *epoch, int64_t *index);
moe_status moe_dataloader_set_position(moe_dataloader *dl, int64_t epoch, int64_t index,
                                       moe_err *err);

/* Checks that the data's tokenizer has model_vocab entries; otherwise MOE_ERR_INPUT naming
 * the data (path) with its tokenizer and vocabulary size, and model.vocab_size. */
moe_status moe_dataloader_check_vocab(const moe_shardset *set, const char *path,
                                      int64_t model_vocab, moe_err *err);

#endif
