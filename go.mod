module github.com/shardd/shardd

go 1.26

require github.com/robfig/cron/v3 v3.0.1

require gopkg.in/yaml.v3 v3.0.1 // indirect
