/*
 * The checks of the uAPI test programs: one "ok WHAT" or "FAIL WHAT:
 * errno" line per check, flushed at once; `failures` counts the FAILs.
 */
#ifndef IOPATH_CHECK_H
#define IOPATH_CHECK_H

#include <stdio.h>
#include <string.h>

static int failures;

static void check(int cond, const char *what, int err)
{
	if (cond) {
		printf("ok %s\n", what);
	} else {
		printf("FAIL %s: errno %d (%s)\n", what, err, strerror(err));
		failures++;
	}
	fflush(stdout);
}

#endif
