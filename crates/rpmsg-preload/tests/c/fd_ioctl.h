/*
 * RPMSG_CREATE_EPT_FD_IOCTL where <linux/rpmsg.h> predates it (the fd
 * series is in rpmsg-next, not in every kernel's headers): the series'
 * own layout. Include after <linux/rpmsg.h>.
 */
#ifndef IOPATH_FD_IOCTL_H
#define IOPATH_FD_IOCTL_H

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

#endif
