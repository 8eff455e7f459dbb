/* ckpt_internal: what ckpt_open.c (MANIFEST, config, tokenizer, state) and ckpt_tensors.c
 * (layout and tensor index) share. Private to libcore. */
#ifndef MOE_CKPT_INTERNAL_H
#define MOE_CKPT_INTERNAL_H

#include "moe/ckpt.h"

/* MANIFEST's first line (since the format's version 2): the number of file lines below it
 * and the CRC32 of their bytes, so that a MANIFEST cut short or edited is refused. */
#define MOE_CKPT_MANIFEST_MAGIC "# moe-genomics MANIFEST v2:"
/* That line for `files` lines of CRC32 crc, without its newline, into buf [n >= 96]. */
void moe_ckpt_manifest_header(char *buf, size_t n, int files, uint32_t crc);

/* An error about file of a checkpoint changed after it was written (MOE_ERR_INPUT, with the
 * hint to use an older checkpoint or rewrite it from an intact copy). */
moe_status moe_ckpt_damaged(moe_err *err, const char *file, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Builds c->table from c->cfg.model, detects the layout of c->dir and indexes and validates
 * every tensor against MANIFEST (c->files) and the table; with_optimizer: the optimizer
 * files too. On failure the tensor part of *c is left closed. */
moe_status moe_ckpt_tensors_open(moe_ckpt *c, int with_optimizer, moe_err *err);
/* Frees the tensor part of *c (files, index, table); safe when it was never opened. */
void moe_ckpt_tensors_close(moe_ckpt *c);

#endif
