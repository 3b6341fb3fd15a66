// Random packet loss for bench/chaos.sh where the kernel has no sch_netem: a tc BPF classifier in
// direct-action mode on a clsact qdisc's egress hook drops each packet with probability
// LOSS_PER_MILLE / 1000 (a compile-time define, default 10: 1%) and passes the rest on to the
// device's root qdisc (netem.sh's tbf), so the rate limit and the loss compose.
//
//   clang -O2 -target bpf -I/usr/include/$(gcc -dumpmachine) -DLOSS_PER_MILLE=10 -c bench/loss.bpf.c -o loss.o
//   tc qdisc add dev DEV clsact
//   tc filter add dev DEV egress bpf da obj loss.o sec classifier
//   tc -s qdisc show dev DEV      (the clsact qdisc's "dropped" counts the packets dropped)
#include <linux/bpf.h>
#include <linux/pkt_cls.h>

#ifndef LOSS_PER_MILLE
#define LOSS_PER_MILLE 10
#endif

static unsigned int (*get_prandom_u32)(void) = (void *)BPF_FUNC_get_prandom_u32;

__attribute__((section("classifier"), used)) int drop(struct __sk_buff *skb) {
  (void)skb;
  return (get_prandom_u32() % 1000u) < (unsigned int)(LOSS_PER_MILLE) ? TC_ACT_SHOT : TC_ACT_OK;
}

char _license[] __attribute__((section("license"), used)) = "GPL";
