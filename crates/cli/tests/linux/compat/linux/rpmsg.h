/*
 * The kernel's <linux/rpmsg.h>, plus what the RPMSG_CREATE_EPT_FD_IOCTL
 * series (rpmsg-next, not in 6.12) adds to it when the kernel's header
 * lacks it: seed 002's program names that ioctl, so without these lines it
 * would not compile against a 6.12 header. The layout is the series' and
 * iopath-rpmsg's (ctrl::uapi). A kernel without the series answers the
 * ioctl itself, with its own errno.
 */
#include_next <linux/rpmsg.h>

#ifndef RPMSG_CREATE_EPT_FD_IOCTL
struct rpmsg_endpoint_fd_info {
	char name[32];
	__u32 src;
	__u32 dst;
	__u32 flags;
	__s32 fd;
};
#define RPMSG_CREATE_EPT_FD_IOCTL _IOWR(0xb5, 0x7, struct rpmsg_endpoint_fd_info)
#endif
