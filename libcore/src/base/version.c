/* version: see moe/version.h. Library versions come from the libraries themselves where they
 * can tell (htslib at run time) and from the build otherwise; the copyright line is the one
 * of LICENSE (tests/e2e/cli_docs.sh compares them). */
#include "moe/version.h"

#include <htslib/hts.h>
#include <jansson.h>
#include <yaml.h>
#include <zlib.h>
#ifdef MOE_HAVE_LIBDEFLATE
#include <libdeflate.h>
#endif

const char *moe_version(void) {
    return MOE_VERSION;
}

void moe_version_print(FILE *fp, const char *prog) {
    fprintf(fp, "%s (moe-genomics) %s\n", prog, MOE_VERSION);
    fputs(MOE_COPYRIGHT "\n", fp);
    fputs("License: MIT <https://opensource.org/licenses/MIT> (the LICENSE file)\n\n", fp);
    fprintf(fp, "htslib %s\n", hts_version());
    fprintf(fp, "zlib %s, libyaml %s, jansson %s\n", zlibVersion(), yaml_get_version_string(),
            JANSSON_VERSION);
#ifdef MOE_HAVE_LIBDEFLATE
    fprintf(fp, "libdeflate %s (CRC-32)\n", LIBDEFLATE_VERSION_STRING);
#endif
#ifdef MOE_HAVE_CBLAS
    fputs("BLAS: OpenBLAS (CBLAS)\n", fp);
#else
    fputs("BLAS: none (built-in blocked matmul)\n", fp);
#endif
#ifdef MOE_HAVE_MPI
    fputs("MPI: yes\n", fp);
#else
    fputs("MPI: no\n", fp);
#endif
#ifdef MOE_CUDA_VERSION
    fprintf(fp, "CUDA: built with CUDA %s\n", MOE_CUDA_VERSION);
#else
    fputs("CUDA: not built\n", fp);
#endif
#ifdef MOE_HAVE_NCCL
    fputs("NCCL: yes (data parallelism on GPUs)\n", fp);
#else
    fputs("NCCL: no\n", fp);
#endif
}
