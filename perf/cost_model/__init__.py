"""The parts of perf/kernel_model.py, the cost model of the Triton step on an H200 (an
estimate, never a measurement), one concern each:

    machine   the H200's figures, CTAs per SM and the time of a launch: the formulas
    aten_ops  the dispatch mode that lists the aten ops a step runs outside the kernels
    sass      a recorded launch compiled for sm_90: registers, shared memory, SASS loops
    chain     a program's longest path outside its tile loops: rounds of loads, instructions
    access    each kernel's reads, writes and tile walks per program: the access table
    shares    the shares of a row's tiles a walk reads, merges or hashes, which it weighs
    bench_rows  what the filters keep and the tiles their consumers read, on the bench rows
    context   what a step's launches tell the later ones: the access table's extra arguments
"""
