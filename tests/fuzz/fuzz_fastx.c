/* fuzz_fastx: libFuzzer harness for the sequence reader (seqio: format sniffing, the
 * FASTA/FASTQ parser over BGZF with its line and record checks, SAM/BAM/CRAM through htslib).
 * The input is given to moe_seqio_open as a "data:" URL, so htslib reads it from memory (no
 * file per input), and read to the end; errors are expected, crashes and leaks are findings. */
#include <stdint.h>
#include <stdlib.h>

#include "fuzz_fixture.h"
#include "moe/seqio.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Quiet (fuzz_quiet): an empty-input or empty-record warning per input is noise. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_quiet("fuzz_fastx");
    return 0;
}

/* data [size] bytes: one input file. Always returns 0 (libFuzzer's contract). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *url = fuzz_data_url(data, size);
    moe_seqio_opts o;
    moe_seqio_opts_defaults(&o);
    moe_err err;
    moe_err_clear(&err);
    moe_seq_reader *r = NULL;
    if (moe_seqio_open(&r, url, &o, &err) == MOE_OK) {
        moe_seq_record rec;
        while (moe_seqio_next(r, &rec, &err) == 1) {
        }
        moe_seqio_close(r);
    }
    free(url);
    return 0;
}
