/* Tests for engine/kve, the cached image embeddings: a round trip on a local directory, the
 * key's inputs (tower, tenant, image) each naming another entry, no replacing an existing
 * entry, and every damaged file a miss: flipped payload or header byte, truncation, a file
 * grown longer, another tower's file under the name. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "kve.h"

enum { NT = 7, DIM = 33 };

struct fx {
	char dir[64];
	uint8_t fp[KVB_HASH], sd[KVB_HASH], img[KVB_HASH];
	float emb[NT * DIM], out[NT * DIM];
};

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	snprintf(f->dir, sizeof(f->dir), "/tmp/test_kve.XXXXXX");
	if (!mkdtemp(f->dir))
		return -1;
	for (int i = 0; i < KVB_HASH; i++) {
		f->fp[i] = (uint8_t)i;
		f->img[i] = (uint8_t)(0xA0 + i);
	}
	kvb_salt_digest("tenant-a", f->sd);
	for (int i = 0; i < NT * DIM; i++)
		f->emb[i] = (float)i * 0.25f - 3.0f;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", f->dir);
	if (system(cmd) != 0)
		return -1;
	free(f);
	return 0;
}

static void entry_path(struct fx *f, const uint8_t *sd, char *out, size_t cap)
{
	uint8_t key[KVB_HASH];
	char rel[160];
	kve_key(f->fp, sd, f->img, key);
	assert_int_equal(kve_path(f->fp, key, rel, sizeof(rel)), 0);
	snprintf(out, cap, "%s/%s", f->dir, rel);
}

static void test_round_trip(void **state)
{
	struct fx *f = *state;
	assert_int_equal(kve_load(f->dir, f->fp, f->sd, f->img, NT, DIM, f->out), -ENOENT);
	assert_int_equal(kve_save(f->dir, 0, f->fp, f->sd, f->img, NT, DIM, f->emb), 0);
	assert_int_equal(kve_load(f->dir, f->fp, f->sd, f->img, NT, DIM, f->out), 0);
	assert_memory_equal(f->emb, f->out, sizeof(f->emb));
	char p[256];
	struct stat st;
	entry_path(f, f->sd, p, sizeof(p));
	assert_int_equal(stat(p, &st), 0);
	assert_int_equal(st.st_size, KVE_HEADER_SIZE + sizeof(f->emb));
	/* a second writer never replaces the entry */
	float other[NT * DIM] = {0};
	assert_int_equal(kve_save(f->dir, 0, f->fp, f->sd, f->img, NT, DIM, other), 1);
	assert_int_equal(kve_load(f->dir, f->fp, f->sd, f->img, NT, DIM, f->out), 0);
	assert_memory_equal(f->emb, f->out, sizeof(f->emb));
	/* as on kvfs (create O_EXCL under the final name): exists -> 1 */
	assert_int_equal(kve_save(f->dir, 1, f->fp, f->sd, f->img, NT, DIM, other), 1);
	/* no temporary left behind */
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "test -z \"$(find '%s' -name '*.tmp.*')\"", f->dir);
	assert_int_equal(system(cmd), 0);
}

/* Another tenant, another tower or another image: another entry (a miss, not a load). */
static void test_key_inputs(void **state)
{
	struct fx *f = *state;
	assert_int_equal(kve_save(f->dir, 0, f->fp, f->sd, f->img, NT, DIM, f->emb), 0);
	uint8_t sd2[KVB_HASH], fp2[KVB_HASH], img2[KVB_HASH];
	kvb_salt_digest("tenant-b", sd2);
	memcpy(fp2, f->fp, KVB_HASH);
	fp2[0] ^= 1;
	memcpy(img2, f->img, KVB_HASH);
	img2[31] ^= 0x80;
	assert_int_equal(kve_load(f->dir, f->fp, sd2, f->img, NT, DIM, f->out), -ENOENT);
	assert_int_equal(kve_load(f->dir, fp2, f->sd, f->img, NT, DIM, f->out), -ENOENT);
	assert_int_equal(kve_load(f->dir, f->fp, f->sd, img2, NT, DIM, f->out), -ENOENT);
	/* the same entry asked with another shape: not loaded */
	assert_int_equal(kve_load(f->dir, f->fp, f->sd, f->img, NT + 1, DIM, f->out),
			 KVB_E_OTHER_MODEL);
	/* bad sizes are refused before anything is written */
	assert_int_equal(kve_save(f->dir, 0, f->fp, f->sd, img2, 0, DIM, f->emb), -EINVAL);
	assert_int_equal(kve_save(f->dir, 0, f->fp, f->sd, img2, NT, KVE_MAX_DIM + 1, f->emb),
			 -EINVAL);
}

static void poke(const char *p, off_t off, uint8_t x)
{
	int fd = open(p, O_RDWR);
	assert_true(fd >= 0);
	uint8_t b;
	assert_int_equal(pread(fd, &b, 1, off), 1);
	b ^= x;
	assert_int_equal(pwrite(fd, &b, 1, off), 1);
	close(fd);
}

static void test_damage_is_a_miss(void **state)
{
	struct fx *f = *state;
	char p[256];
	entry_path(f, f->sd, p, sizeof(p));
	assert_int_equal(kve_save(f->dir, 0, f->fp, f->sd, f->img, NT, DIM, f->emb), 0);
	poke(p, KVE_HEADER_SIZE + 100, 0x01); /* payload */
	assert_int_equal(kve_load(f->dir, f->fp, f->sd, f->img, NT, DIM, f->out), -EBADMSG);
	poke(p, KVE_HEADER_SIZE + 100, 0x01);
	assert_int_equal(kve_load(f->dir, f->fp, f->sd, f->img, NT, DIM, f->out), 0);
	poke(p, 50, 0x10); /* header: its CRC */
	assert_int_equal(kve_load(f->dir, f->fp, f->sd, f->img, NT, DIM, f->out), -EBADMSG);
	poke(p, 50, 0x10);
	poke(p, 0, 0xFF); /* magic */
	assert_int_equal(kve_load(f->dir, f->fp, f->sd, f->img, NT, DIM, f->out), -EBADMSG);
	poke(p, 0, 0xFF);
	assert_int_equal(truncate(p, KVE_HEADER_SIZE + sizeof(f->emb) - 4), 0);
	assert_int_equal(kve_load(f->dir, f->fp, f->sd, f->img, NT, DIM, f->out), -EIO);
	assert_int_equal(truncate(p, KVE_HEADER_SIZE + sizeof(f->emb) + 4), 0);
	assert_int_equal(kve_load(f->dir, f->fp, f->sd, f->img, NT, DIM, f->out), -EIO);
	assert_int_equal(truncate(p, 100), 0);
	assert_int_equal(kve_load(f->dir, f->fp, f->sd, f->img, NT, DIM, f->out), -EIO);
	/* another tower's well-formed file put under this name */
	assert_int_equal(unlink(p), 0);
	uint8_t fp2[KVB_HASH];
	memcpy(fp2, f->fp, KVB_HASH);
	fp2[5] ^= 4;
	assert_int_equal(kve_save(f->dir, 0, fp2, f->sd, f->img, NT, DIM, f->emb), 0);
	char p2[256];
	uint8_t key2[KVB_HASH];
	char rel2[160];
	kve_key(fp2, f->sd, f->img, key2);
	assert_int_equal(kve_path(fp2, key2, rel2, sizeof(rel2)), 0);
	snprintf(p2, sizeof(p2), "%s/%s", f->dir, rel2);
	assert_int_equal(rename(p2, p), 0);
	assert_int_equal(kve_load(f->dir, f->fp, f->sd, f->img, NT, DIM, f->out),
			 KVB_E_OTHER_MODEL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_key_inputs, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_damage_is_a_miss, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
