# The probe as run for the first table (pgemm0/README.md); the second table: CANDS as listed there, 20 rounds.
import torch,triton,triton.language as tl,statistics as S,sys
from triton.tools.tensor_descriptor import TensorDescriptor as D
import iris_fw.gemm_tiles as T
@triton.jit
def st(d,v,r0,c0,BR:tl.constexpr,BC:tl.constexpr,SUB:tl.constexpr):
    if SUB==1:d.store([r0,c0],v.to(d.dtype))
    else:
        l,r=tl.split(tl.permute(tl.reshape(v,(BR,2,BC//2)),(0,2,1)));d.store([r0,c0],l.to(d.dtype));d.store([r0,c0+BC//2],r.to(d.dtype))
@triton.jit
def pp(p,s,BM:tl.constexpr,BN:tl.constexpr):
    return p+s.to(tl.int64)*(BM*BN)+(tl.arange(0,BM)[:,None]*BN+tl.arange(0,BN)[None,:])
@triton.jit
def kern(a,b,c,P,C,M,N,K,dp,BM:tl.constexpr,BN:tl.constexpr,BK:tl.constexpr,G:tl.constexpr,NP:tl.constexpr,FL:tl.constexpr,SUB:tl.constexpr,SK:tl.constexpr):
    tm=tl.cdiv(M,BM);tn=tl.cdiv(N,BN);pid=tl.program_id(0);sd=pid-NP
    for t in tl.range(pid,dp,NP,flatten=FL):
        pm,pn=T.grouped_tile(t,tm,tn,G);acc=T.matmul_tile(a,b,pm*BM,pn*BN,M,N,K,0,0,0,0,BM,BN,BK,True,True,False)
        sd+=NP;sm,sn=T.grouped_tile(sd,tm,tn,G);st(c,acc,sm*BM,sn*BN,BM,BN,SUB)
    if SK:
        steps=tl.cdiv(K,BK);tot=((tm*tn-dp)*steps).to(tl.int64);s0=pid*tot//NP;e=(pid+1)*tot//NP;cur=s0
        while cur<e:
            u=cur//steps;k0=(cur-u*steps).to(tl.int32);k1=tl.minimum(steps,k0+(e-cur)).to(tl.int32)
            pm,pn=T.grouped_tile(dp+u.to(tl.int32),tm,tn,G);acc=T.matmul_tile_k(a,b,pm*BM,pn*BN,M,N,K,0,0,0,0,k0,k1,BM,BN,BK,True,True,False)
            if (k0==0)&(k1==steps):st(c,acc,pm*BM,pn*BN,BM,BN,SUB)
            else:
                tl.store(pp(P,pid*2+(cur!=s0).to(tl.int64),BM,BN),acc);tl.debug_barrier();dn=tl.atomic_add(C+u,k1-k0,sem="acq_rel",scope="gpu");tl.debug_barrier()
                if dn+(k1-k0)==steps:
                    qf=((u*steps+1)*NP+tot-1)//tot-1;ql=((u+1)*steps*NP+tot-1)//tot-1;o=tl.zeros((BM,BN),tl.float32)
                    for q in range(qf,ql+1):
                        qs=q*tot//NP
                        if (q+1)*tot//NP>qs:o+=tl.load(pp(P,q*2+(qs//steps!=u).to(tl.int64),BM,BN),cache_modifier=".cg")
                    tl.store(C+u,0);st(c,o,pm*BM,pn*BN,BM,BN,SUB)
            cur+=k1-k0
KEEP=[]
CANDS=[(128,256,64,8,8,3,0,1,1),(128,256,32,8,8,5,0,1,1),(128,256,64,8,8,3,1,0,1),(128,256,64,8,8,3,1,1,1),(128,256,64,8,8,3,0,1,1),(128,256,64,8,8,4,1,1,2),(128,256,32,8,8,5,1,0,1),(128,256,32,8,8,5,1,1,1),(128,256,32,8,8,6,1,1,1),(128,256,32,8,8,5,0,1,1),(128,256,64,16,8,3,1,1,1),(128,256,64,8,8,3,1,2,1),(256,128,64,8,8,3,1,1,1),(128,256,32,8,8,7,1,1,2)]
m,n,k=16384,14336,4096;a=torch.randn(m,k,device="cuda").div_(64).bfloat16();bs=[torch.randn(k,n,device="cuda").bfloat16() for _ in range(3)];o=torch.empty(m,n,device="cuda",dtype=torch.bfloat16)
ref=(a.float()@bs[0].float());NS=132;Cn=torch.zeros(4096,dtype=torch.int32,device="cuda")
def mk(bm,bn,bk,g,w,s,fl,sk,sub):
    tiles=(m//bm)*(n//bn);rem=tiles%NS;skt=0 if not sk or not rem else min(tiles,rem+(sk-1)*NS);P=torch.empty(NS*2*bm*bn,device="cuda")
    ad=D.from_tensor(a,[bm,bk]);bd=[D.from_tensor(x,[bk,bn]) for x in bs];cd=D.from_tensor(o,[bm,bn//sub])
    return lambda i:kern[(NS,)](ad,bd[i%3],cd,P,Cn,m,n,k,tiles-skt,BM=bm,BN=bn,BK=bk,G=g,NP=NS,FL=fl,SUB=sub,SK=skt>0,num_warps=w,num_stages=s)
def gr(f):
    for i in range(5):f(i)
    torch.cuda.synchronize();g=torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(5):f(i)
    return g.replay
R={"cublas":gr(lambda i:torch.matmul(a,bs[i%3],out=o))}
try:
    from iris_fw.gemm import matmul as MM,GemmConfig as GC;R["tile128x256x32s5"]=gr(lambda i:MM(a,bs[i%3],out=o,config=GC(128,256,32,8,8,5)))
except Exception as x:print("tile FAIL",x)
for c in CANDS:
    try:
        f=mk(*c);f(0);e=float((o.float()-ref).abs().max()/ref.abs().max());KEEP.append(f);R[str(c)+" err%.1e"%e]=gr(f)
    except Exception as x:print(c,"FAIL",str(x)[:200],flush=True)
t={x:[] for x in R}
for r in range(12):
    for x in R:
        s,e=torch.cuda.Event(True),torch.cuda.Event(True);s.record();R[x]();e.record();e.synchronize();t[x].append(s.elapsed_time(e)*200)
cb=S.median(t["cublas"])
for x in R:print("%-48s %8.1f us %5.1f%%"%(x,S.median(t[x]),100*cb/S.median(t[x])),flush=True)
