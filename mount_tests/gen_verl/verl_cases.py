"""The generated verl cases (mount_tests/gen_verl/generate_verl.py), shared by the generator (in the sid
chroot) and the tests (host).  Standard library only.

Each case: FSDP version, world size, mesh shape (1-D `fsdp`, or 2-D `ddp` x `fsdp`), model dtype, the model's
sizes, the roles saved (actor, critic) and the steps saved (the last one is the tracker's); the chroot it is
written in: "sid" (torch 2.14, a transformers Llama) or "trixie" (torch 2.6, whose DTensor pickles keep the
mesh as a tensor of ranks; no transformers there: a small module with Llama-style names).
"""
GEN_VERSION = 3

# name -> settings
CASES = {
    # FSDP1 with device_mesh (DTensors, Shard(0)), an actor and a critic (token classification: score [1, 32]
    # is 1 row on rank 0 and empty on rank 1), two steps; the case transformers loads from the mount
    "fsdp1_ws2_fp32_critic": dict(fsdp=1, world_size=2, mesh=[2], dtype="float32", hidden=32, inter=88, layers=2,
                                  vocab=131, roles=["actor", "critic"], steps=[1, 3], tiny=0),
    # FSDP2, bf16 weights, 4 ranks: hidden 42 divides by nothing -> Shard(0) in torch.chunk sizes 11/11/11/9,
    # [131, 42] -> 33/33/33/32; down_proj [42, 88] -> Shard(1)
    "fsdp2_ws4_bf16": dict(fsdp=2, world_size=4, mesh=[4], dtype="bfloat16", hidden=42, inter=88, layers=2,
                           vocab=131, roles=["actor"], steps=[5], tiny=0),
    # FSDP2 on a 2-D mesh (ddp 2 x fsdp 2, HSDP): placements (Replicate(), Shard(d)), embed/lm_head Shard(1)
    "fsdp2_hsdp_ws4": dict(fsdp=2, world_size=4, mesh=[2, 2], dtype="float32", hidden=32, inter=88, layers=1,
                           vocab=131, roles=["actor"], steps=[2], tiny=0),
    # FSDP1 on 4 ranks with uneven and empty shards: a [3] parameter is 1/1/1/0 rows
    "fsdp1_ws4_uneven": dict(fsdp=1, world_size=4, mesh=[4], dtype="float32", hidden=42, inter=88, layers=1,
                             vocab=131, roles=["actor"], steps=[4], tiny=3),
    # the bundled example (examples/verl-fsdp2-ws2): small enough to ship
    "fsdp2_ws2_example": dict(fsdp=2, world_size=2, mesh=[2], dtype="float32", hidden=16, inter=32, layers=1,
                              vocab=64, roles=["actor"], steps=[1, 2], tiny=0),
    # torch 2.6: FSDP1 on 2 ranks and FSDP2 on a ddp 2 x fsdp 2 mesh
    "fsdp1_ws2_torch26": dict(fsdp=1, world_size=2, mesh=[2], dtype="float32", hidden=32, inter=88, layers=2,
                              vocab=131, roles=["actor"], steps=[2], tiny=0, chroot="trixie"),
    "fsdp2_hsdp_ws4_torch26": dict(fsdp=2, world_size=4, mesh=[2, 2], dtype="bfloat16", hidden=32, inter=88,
                                   layers=1, vocab=131, roles=["actor"], steps=[1], tiny=0, chroot="trixie"),
}


def chroot_of(name):
    return CASES[name].get("chroot", "sid")
