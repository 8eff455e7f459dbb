/* test_convert: the piece of moe-convert that needs no files - --max-shard-size parsing.
 * (Its tensor list is the model's parameter table, tested in test_model_params.) The file
 * conversions themselves are tested end to end in tests/e2e/convert_roundtrip.sh. */
#include "moe/convert.h"
#include "testlib.h"

int main(void) {
    CHECK_INT_EQ(moe_convert_parse_size("5GB"), 5000000000LL);
    CHECK_INT_EQ(moe_convert_parse_size("500MB"), 500000000LL);
    CHECK_INT_EQ(moe_convert_parse_size("20KB"), 20000);
    CHECK_INT_EQ(moe_convert_parse_size("2GiB"), 2147483648LL);
    CHECK_INT_EQ(moe_convert_parse_size("1.5MB"), 1500000);
    CHECK_INT_EQ(moe_convert_parse_size("12345"), 12345);
    CHECK_INT_EQ(moe_convert_parse_size("5 GB"), -1);
    CHECK_INT_EQ(moe_convert_parse_size("GB"), -1);
    CHECK_INT_EQ(moe_convert_parse_size("-3MB"), -1);
    CHECK_INT_EQ(moe_convert_parse_size("0"), -1);
    return test_summary("convert");
}
