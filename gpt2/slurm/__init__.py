"""kgpt on a Slurm cluster: Slurm schedules, kgpt only writes scripts and asks.

- ``commands``  sbatch, squeue, scancel and scontrol, run with argument lists (never a
                shell), their answers parsed, their failures turned into SlurmError
- ``script``    the sbatch scripts kgpt writes: readable, every setting an #SBATCH line
- ``task``      what runs inside an allocation: a training command, watched, so a job
                that is told its time is nearly up saves a checkpoint and requeues itself

The matrix's Slurm backend is gpt2/matrix/slurm_backend.py; `make SLURM=1` for a
single run is in gpt2/cli/slurm_commands.py. docs/matrix.md and docs/distributed.md
say how to use them; scripts/slurm_cluster.py starts a one-node cluster to try them.
"""
