/* version: what `--version` of every tool prints, so all four agree.
 *
 * First line is parseable like samtools': "<prog> (moe-genomics) X.Y.Z"; then the copyright
 * and licence lines (MIT, as LICENSE), then the libraries this build uses (htslib, BLAS, MPI,
 * CUDA). */
#ifndef MOE_VERSION_H
#define MOE_VERSION_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The copyright line of LICENSE, printed by --version and the README. */
#define MOE_COPYRIGHT "Copyright (c) 2026 the moe-genomics authors"

const char *moe_version(void); /* "X.Y.Z" */
void moe_version_print(FILE *fp, const char *prog);

#ifdef __cplusplus
}
#endif

#endif
