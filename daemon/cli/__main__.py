from vigil.daemon.cli import console

console()
