/* ucpx_strerror: static names of the status codes (no Go involved). */
#include "ucpx.h"

const char *ucpx_strerror(int code) {
	switch (code) {
	case UCPX_OK: return "UCPX_OK";
	case UCPX_ERR_INVALID_PARAM: return "UCPX_ERR_INVALID_PARAM";
	case UCPX_ERR_INVALID_HANDLE: return "UCPX_ERR_INVALID_HANDLE";
	case UCPX_ERR_UNSUPPORTED: return "UCPX_ERR_UNSUPPORTED";
	case UCPX_ERR_CLOSED: return "UCPX_ERR_CLOSED";
	case UCPX_ERR_TIMEOUT: return "UCPX_ERR_TIMEOUT";
	case UCPX_ERR_PEER_FAILED: return "UCPX_ERR_PEER_FAILED";
	case UCPX_ERR_CANCELED: return "UCPX_ERR_CANCELED";
	case UCPX_ERR_TRUNCATED: return "UCPX_ERR_TRUNCATED";
	case UCPX_ERR_OUT_OF_RANGE: return "UCPX_ERR_OUT_OF_RANGE";
	case UCPX_ERR_INVALID_ADDR: return "UCPX_ERR_INVALID_ADDR";
	case UCPX_ERR_BUSY: return "UCPX_ERR_BUSY";
	case UCPX_ERR_BUFFER_TOO_SMALL: return "UCPX_ERR_BUFFER_TOO_SMALL";
	case UCPX_ERR_NO_DEVICE: return "UCPX_ERR_NO_DEVICE";
	case UCPX_ERR_AUTH: return "UCPX_ERR_AUTH";
	case UCPX_ERR_REVOKED: return "UCPX_ERR_REVOKED";
	case UCPX_ERR_SEND_INCOMPLETE: return "UCPX_ERR_SEND_INCOMPLETE";
	case UCPX_ERR_OTHER: return "UCPX_ERR_OTHER";
	}
	return "UCPX_ERR_UNKNOWN";
}
