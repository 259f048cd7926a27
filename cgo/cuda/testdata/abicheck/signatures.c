/* Compiled by TestABIAgainstHeader with -Werror against a real cuda.h: every
 * entry point of cu_syms.h must name a symbol cuda.h declares (so the version
 * suffix is the one cuda.h maps the API name to) with exactly the parameter
 * list ucpx calls it with. */
#include UCPX_REAL
#include "cu_syms.h"

#define UCPX_CHECK(api, sym, params) CUresult (*ucpx_check_##api) params = &sym;
UCPX_CU_SYMBOLS(UCPX_CHECK)

int main(void) { return 0; }
