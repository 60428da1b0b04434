/* kvb internals shared by the files of the kv dir's two formats, KV blocks (kvb.c) and image
 * embeddings (kve.c): little-endian fields and the header CRC rule. */
#ifndef KVFS_KVB_INT_H
#define KVFS_KVB_INT_H

#include <stddef.h>
#include <stdint.h>

#include "kvec.h"

static inline void kvb_put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint32_t kvb_get32(const uint8_t *p)
{
	return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
	       ((uint32_t)p[3] << 24);
}

/* CRC32C of a size-byte header with its 4-byte CRC field at crc_off read as zero. */
static inline uint32_t kvb_header_crc(const uint8_t *h, size_t size, size_t crc_off)
{
	static const uint8_t z4[4];
	uint32_t crc = kvec_crc32c(0, h, crc_off);
	crc = kvec_crc32c(crc, z4, 4);
	return kvec_crc32c(crc, h + crc_off + 4, size - crc_off - 4);
}

#endif
