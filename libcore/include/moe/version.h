/* version: what `--version` of every tool prints, so all four agree.
 *
 * First line is parseable like samtools': "<prog> (moe-genomics) X.Y.Z"; the following
 * lines name the libraries this build uses (htslib, BLAS, MPI, CUDA). */
#ifndef MOE_VERSION_H
#define MOE_VERSION_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

const char *moe_version(void); /* "X.Y.Z" */
void moe_version_print(FILE *fp, const char *prog);

#ifdef __cplusplus
}
#endif

#endif
