/* ckpt_internal: what ckpt_open.c (MANIFEST, config, tokenizer, state) and ckpt_tensors.c
 * (layout and tensor index) share. Private to libcore. */
#ifndef MOE_CKPT_INTERNAL_H
#define MOE_CKPT_INTERNAL_H

#include "moe/ckpt.h"

/* Builds c->table from c->cfg.model, detects the layout of c->dir and indexes and validates
 * every tensor against MANIFEST (c->files) and the table; with_optimizer: the optimizer
 * files too. On failure the tensor part of *c is left closed. */
moe_status moe_ckpt_tensors_open(moe_ckpt *c, int with_optimizer, moe_err *err);
/* Frees the tensor part of *c (files, index, table); safe when it was never opened. */
void moe_ckpt_tensors_close(moe_ckpt *c);

#endif
