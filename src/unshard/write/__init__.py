"""Writing a plan into its output: execute.py stages the folder, has it written and finished by the sink,
and puts it in place; threads.py writes the files on threads, assemble.py turns each group's source pieces
into the bytes the writer takes, scale_out.py deals the files out to processes or torchrun ranks.
"""
