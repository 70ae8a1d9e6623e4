from edgectl.cli import main

main()
