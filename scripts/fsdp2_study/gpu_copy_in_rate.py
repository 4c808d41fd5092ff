import os,sys,time,torch,torch.nn as nn,torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard,MixedPrecisionPolicy as MP
r=int(os.environ["RANK"]);torch.cuda.set_device(r);dist.init_process_group("nccl")
mesh=init_device_mesh("cuda",(int(os.environ["WORLD_SIZE"]),))
class H:
  def __init__(s,t):s.t=t;s.__cuda_array_interface__=dict(shape=tuple(t.shape),typestr="<f4",data=(t.data_ptr(),False),version=3,strides=None)
G=lambda st:(getattr(st,'_fsdp_param_groups',None) or [st._fsdp_param_group])[0]
def mk(home,bf):
  torch.manual_seed(0);m=nn.Sequential(*[nn.Linear(4096,4097) if i%2==0 else nn.Linear(4097,4096) for i in range(8)]).cuda()
  kw=dict(mp_policy=MP(param_dtype=torch.bfloat16,reduce_dtype=torch.float32)) if bf else {}
  for b in m:fully_shard(b,mesh=mesh,**kw)
  fully_shard(m,mesh=mesh,**kw);pins=[]
  if home:
    for b in m:
      for fp in G(b._get_fsdp_state()).fsdp_params:
        d=fp._sharded_param_data;c=d.cpu().pin_memory();pins.append(c)
        h=torch.as_tensor(H(c),device="cuda");assert h.data_ptr()==c.data_ptr()
        fp._sharded_param_data=h;p=fp.sharded_param;n=p._local_tensor.numel();p._local_tensor=h[:n].view(p._local_tensor.shape)
  return m,pins
def run(home,bf):
  m,pins=mk(home,bf);o=torch.optim.AdamW(m.parameters(),lr=1e-3,foreach=True)
  torch.manual_seed(1+r);x=torch.randn(8,4096,device="cuda");L=[]
  for i in range(6):
    if i==2:torch.cuda.synchronize();t=time.time()
    l=m(x).float().square().mean();l.backward();o.step();o.zero_grad();L.append(l.item())
  torch.cuda.synchronize();dt=(time.time()-t)/4
  p0=list(m.parameters())[0];loc=p0.to_local()
  return L,dt,torch.cuda.max_memory_allocated()>>20,loc.data_ptr()==pins[0].data_ptr() if pins else None,[p.to_local().float().cpu() for p in m.parameters()]
for bf in (0,1):
  a=run(0,bf);torch.cuda.reset_peak_memory_stats();b=run(1,bf)
  same=all(torch.equal(u,v) for u,v in zip(a[4],b[4]))
  if r==0:print(f"bf16={bf} device-shards loss={a[0][-1]:.6f} {a[1]*1e3:.1f}ms/it peak={a[2]}MiB | host-shards loss={b[0][-1]:.6f} {b[1]*1e3:.1f}ms/it peak={b[2]}MiB still_home={b[3]} params_bitwise_equal={same} losses_equal={a[0]==b[0]}",flush=True)
dist.destroy_process_group()
